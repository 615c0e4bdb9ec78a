"""The decode-side decisions of a push worker through kvdrain.vllm.PushConsumer (NIXL and
the engine stubbed). With vLLM 0.33 itself, turn on the connector plugin instead:
``--kv-transfer-config '{"kv_connector": "KvdrainPushConnector",
"kv_connector_module_path": "kvdrain.vllm.connector", ...}'`` (docs/vllm.md)."""

from __future__ import annotations

from kvdrain.vllm import PushConsumer

consumer = PushConsumer(world_size=1, capacity=4096)

# Registration, before the PUSH_REG goes out.
consumer.start_load_kv("cmpl-7-0", [100, 101], tp_size=2, pp_size=1)
consumer.start_load_kv("cmpl-8-0", [102], tp_size=2, pp_size=1)

# Writer thread: one get_new_notifs() batch.
for agent, message in consumer.writer_batch(
    {
        "P0": [b"cmpl-7-0:2", b"PUSH_FAIL:cmpl-8-0:2"],
        "P1": [b"cmpl-7-0:2", b"PUSH_FAIL:cmpl-8-0:2", b"HB:r"],
    }
):
    print("producer-bound, for the engine's own handler:", agent, message)

# Engine thread, each step.
consumer.get_new_notifs()
finished, failed = consumer.get_transfer_results()
print("finished_recving", finished, "failed", failed)
print("invalid blocks", consumer.get_block_ids_with_load_errors())
if consumer.request_finished("cmpl-8-0"):
    # Its PUSH_FAILs may report writes that errored after posting and can still land:
    # the blocks settle for settle_ms (5 s by default) after the last one.
    print("blocks of cmpl-8-0 stay fenced until get_released() names them")
print("released", consumer.get_released())
