"""The decode side of a push worker through kvdrain.vllm.DecodeSide (NIXL and the engine
stubbed). With vLLM 0.33 itself, turn on the connector plugin instead:
``--kv-transfer-config '{"kv_connector": "KvdrainPushConnector",
"kv_connector_module_path": "kvdrain.vllm.connector", ...}'`` (docs/vllm.md)."""

from __future__ import annotations

from kvdrain.vllm import DecodeReport, DecodeSide, Settings

settings = Settings(deadline_ms=480_000, quarantine_ms=60_000, settle_ms=5_000, capacity=4096)
decode = DecodeSide(settings, world_size=1)


def tell(report: DecodeReport) -> None:
    """What the engine is told (the plugin applies this to vLLM's own structures)."""
    for rid in report.completed:
        print("finished_recving (the blocks hold its KV):", rid)
    for blocks in report.invalid:
        print("invalid blocks (fail or recompute the request, keep them held):", blocks)
    for rid in report.released:
        print("finished_recving + failed_recving (free its blocks now):", rid)


# start_load_kv: the clock to now, then each receive registered before its PUSH_REG goes
# out; expected notices = pp × max(1, producer TP // world_size) = 1 × max(1, 2 // 1).
report = decode.catch_up()
for rid, blocks in (("cmpl-7-0", [100, 101]), ("cmpl-8-0", [102]), ("cmpl-9-0", [103])):
    if decode.register(rid, [blocks], 2, report) in ("refused", "held"):
        print("no PUSH_REG for", rid, "; fail it now")
# The scheduler finished cmpl-9-0 early (an abort): its blocks stay fenced until released.
decode.abort("cmpl-9-0", report)
tell(report)

# Writer thread: one get_new_notifs() batch; the producer-bound messages come back.
for agent, messages in decode.feed(
    {
        "P0": [b"cmpl-7-0:2", b"PUSH_FAIL:cmpl-8-0:2"],
        "P1": [b"cmpl-7-0:2", b"PUSH_FAIL:cmpl-8-0:2", b"HB:r"],
    }
).items():
    print("producer-bound, for vLLM's own handler:", agent, messages)

# Engine thread, each step (get_finished). cmpl-8-0 failed: its PUSH_FAILs may report
# writes that errored after posting and can still land, so its blocks settle for
# settle_ms after the last one before report.released names it.
report = decode.step()
tell(report)
print("cmpl-8-0:", decode.phase("cmpl-8-0"), "cmpl-9-0:", decode.phase("cmpl-9-0"))
# get_block_ids_with_load_errors: vLLM's own invalid blocks (here the report's) less
# those of the requests released now (reported once, when they failed).
print("invalid blocks for vLLM", decode.drop_reported(set().union(*report.invalid)))
print("counters", {k: v for k, v in decode.counters().items() if v})
