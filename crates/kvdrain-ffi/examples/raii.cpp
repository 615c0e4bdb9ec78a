// kvdrain from C++: RAII owners for the three handles, and notifications fed the way a
// C++ engine receives them from NIXL (TensorRT-LLM: unordered_map<sender, vector<msg>>).
//
// Built and run by `make c-test` (g++ -fsanitize=address,undefined). Exits 0 when the
// decisions are the expected ones.
#include "kvdrain.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace kvdrain {

struct Error : std::runtime_error {
    explicit Error(kvdrain_status s) : std::runtime_error(kvdrain_status_str(s)), status(s) {}
    kvdrain_status status;
};

inline void check(kvdrain_status s) {
    if (s != KVDRAIN_OK) throw Error(s);
}

struct LedgerFree { void operator()(kvdrain_ledger *p) const { kvdrain_ledger_free(p); } };
struct IngestFree { void operator()(kvdrain_ingest *p) const { kvdrain_ingest_free(p); } };
struct EngineFree { void operator()(kvdrain_engine *p) const { kvdrain_engine_free(p); } };

// Owns a ledger and its halves; each handle is freed exactly once, in any order.
class Ledger {
public:
    explicit Ledger(uint32_t capacity) {
        kvdrain_config cfg;
        check(kvdrain_config_default(capacity, &cfg));
        kvdrain_ledger *l = nullptr;
        check(kvdrain_ledger_new(&cfg, &l));
        ledger_.reset(l);
        kvdrain_ingest *i = nullptr;
        kvdrain_engine *e = nullptr;
        check(kvdrain_ledger_split(l, &i, &e));
        ingest_.reset(i);
        engine_.reset(e);
    }

    uint64_t register_edges(const std::string &id, uint64_t blocks,
                            const std::vector<uint16_t> &agents) {
        kvdrain_registration r{};
        r.id = reinterpret_cast<const uint8_t *>(id.data());
        r.id_len = id.size();
        r.blocks = blocks;
        r.agents = agents.data();
        r.agents_len = agents.size();
        uint64_t key = 0;
        check(kvdrain_engine_register(engine_.get(), &r, &key));
        return key;
    }

    // Feeds every message of every sender in one batch call (ingest thread).
    size_t feed(const std::unordered_map<std::string, std::vector<std::string>> &by_sender,
                const std::unordered_map<std::string, uint16_t> &agent_ids) {
        std::vector<uint16_t> agents;
        std::vector<const uint8_t *> msgs;
        std::vector<size_t> lens;
        for (const auto &[sender, messages] : by_sender) {
            for (const auto &m : messages) {
                agents.push_back(agent_ids.at(sender));
                msgs.push_back(reinterpret_cast<const uint8_t *>(m.data()));
                lens.push_back(m.size());
            }
        }
        size_t decided = 0;
        check(kvdrain_ingest_feed_batch(ingest_.get(), agents.size(), agents.data(), msgs.data(),
                                        lens.data(), nullptr, &decided));
        return decided;
    }

    // Every decision waiting (engine thread).
    std::vector<kvdrain_decision> poll() {
        std::vector<kvdrain_decision> out;
        kvdrain_decision buf[16];
        for (;;) {
            size_t n = sizeof buf / sizeof buf[0];
            check(kvdrain_engine_poll(engine_.get(), buf, &n));
            out.insert(out.end(), buf, buf + n);
            if (n < sizeof buf / sizeof buf[0]) return out;
        }
    }

    // Moves the clock; deadlines, settle ends and quarantine ends due by now_ms queue
    // their decisions for poll().
    void advance(uint64_t now_ms) { check(kvdrain_engine_advance(engine_.get(), now_ms)); }

private:
    // Declared so that the halves are destroyed before the ledger (any order is safe).
    std::unique_ptr<kvdrain_ledger, LedgerFree> ledger_;
    std::unique_ptr<kvdrain_ingest, IngestFree> ingest_;
    std::unique_ptr<kvdrain_engine, EngineFree> engine_;
};

}  // namespace kvdrain

int main() {
    kvdrain::Ledger ledger(1024);
    const std::unordered_map<std::string, uint16_t> agent_ids{{"prefill-0", 0}, {"prefill-1", 1}};
    uint64_t ok = ledger.register_edges("cmpl-1-0", 100, {0, 1});
    uint64_t bad = ledger.register_edges("cmpl-2-0", 200, {0, 1});

    std::unordered_map<std::string, std::vector<std::string>> notifs{
        {"prefill-0", {"cmpl-1-0:2", "cmpl-2-0:2"}},
        {"prefill-1", {"cmpl-1-0:2", "PUSH_FAIL:cmpl-2-0:2", "HB:x"}},
    };
    size_t decided = ledger.feed(notifs, agent_ids);

    std::vector<kvdrain_decision> decisions = ledger.poll();  // COMPLETED, FAILED
    ledger.advance(5000);  // the failure notice settles (settle_ms, 5 s by default)
    for (const kvdrain_decision &d : ledger.poll()) decisions.push_back(d);  // RELEASED
    int completed = 0, failed = 0, released = 0;
    for (const kvdrain_decision &d : decisions) {
        if (d.kind == KVDRAIN_COMPLETED && d.key == ok && d.blocks == 100) completed++;
        if (d.kind == KVDRAIN_FAILED && d.key == bad) failed++;
        if (d.kind == KVDRAIN_RELEASED && d.key == bad && d.blocks == 200) released++;
    }
    try {
        ledger.register_edges("cmpl-1-0", 1, {0, 0});
        return 1;
    } catch (const kvdrain::Error &e) {
        std::printf("refused as expected: %s\n", e.what());
        if (e.status != KVDRAIN_ERR_BAD_EDGES) return 1;
    }
    std::printf("decided %zu: completed %d, failed %d, released %d\n", decided, completed, failed,
                released);
    return decided == 2 && completed == 1 && failed == 1 && released == 1 ? 0 : 1;
}
