/*
 * The C ABI against the failure catalogue (docs/protocol.md): C2 in both orders,
 * duplicates, unknown ids, garbage bytes, a full table and a refused hold, abort,
 * deadline, fence, gone, settling (from the last advance, or from a notice's arrival),
 * the record of a decision, handle misuse, the producer's owed notices, and two threads
 * feeding and polling at once (>= 10^5 requests, no decision lost or doubled).
 *
 * Built by `make c-test` with -fsanitize=address,undefined against the static library,
 * and once more against the installed library through pkg-config. Prints
 * "N passed, 0 failed" and exits 0 when every check holds.
 */
#include "kvdrain.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks_failed = 0;
static int tests_passed = 0;
static int tests_failed = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            checks_failed++;                                                          \
        }                                                                             \
    } while (0)

#define EXPECT(call, want)                                                            \
    do {                                                                              \
        kvdrain_status got_ = (call);                                                 \
        if (got_ != (want)) {                                                         \
            fprintf(stderr, "%s:%d: %s returned %u (%s), expected %s\n", __FILE__,    \
                    __LINE__, #call, (unsigned)got_, kvdrain_status_str(got_), #want); \
            checks_failed++;                                                          \
        }                                                                             \
    } while (0)

#define OK(call) EXPECT(call, KVDRAIN_OK)

typedef struct {
    kvdrain_ledger *ledger;
    kvdrain_ingest *ingest;
    kvdrain_engine *engine;
} fixture;

static fixture open_with(const kvdrain_config *cfg) {
    fixture f = {0};
    OK(kvdrain_ledger_new(cfg, &f.ledger));
    OK(kvdrain_ledger_split(f.ledger, &f.ingest, &f.engine));
    return f;
}

static fixture open_ledger(uint32_t capacity, uint64_t deadline_ms, uint64_t quarantine_ms) {
    kvdrain_config cfg;
    OK(kvdrain_config_default(capacity, &cfg));
    cfg.deadline_ms = deadline_ms;
    cfg.quarantine_ms = quarantine_ms;
    /* The catalogue's failure paths expect the release with the decision (vLLM's
     * behaviour); test_settling covers rule 8 with settle_ms > 0. */
    cfg.settle_ms = 0;
    return open_with(&cfg);
}

static void close_ledger(fixture *f) {
    kvdrain_ingest_free(f->ingest);
    kvdrain_engine_free(f->engine);
    kvdrain_ledger_free(f->ledger);
}

static kvdrain_status reg(fixture *f, const char *id, uint64_t blocks, uint32_t count,
                          const uint16_t *agents, size_t n_agents, uint64_t deadline_ms,
                          uint64_t *key) {
    kvdrain_registration r = {
        .id = (const uint8_t *)id,
        .id_len = strlen(id),
        .blocks = blocks,
        .count = count,
        .agents = agents,
        .agents_len = n_agents,
        .deadline_ms = deadline_ms,
    };
    return kvdrain_engine_register(f->engine, &r, key);
}

static kvdrain_notice feed(fixture *f, uint16_t agent, const char *msg) {
    kvdrain_notice outcome = (kvdrain_notice)99;
    OK(kvdrain_ingest_feed(f->ingest, agent, (const uint8_t *)msg, strlen(msg), &outcome));
    return outcome;
}

/* Every decision waiting, polled with room `room` per call. */
static size_t poll_all(fixture *f, kvdrain_decision *out, size_t cap, size_t room) {
    size_t total = 0;
    for (;;) {
        size_t n = room < cap - total ? room : cap - total;
        size_t asked = n;
        OK(kvdrain_engine_poll(f->engine, out + total, &n));
        total += n;
        if (n < asked || total == cap) return total;
    }
}

static void expect_decision(const kvdrain_decision *d, kvdrain_decision_kind kind, uint64_t key,
                            uint64_t blocks, uint8_t forced) {
    CHECK(d->kind == kind);
    CHECK(d->key == key);
    CHECK(d->blocks == blocks);
    CHECK(d->forced == forced);
}

/* C2: a producer that could not post sends PUSH_FAIL; the failure waits for the sibling's
 * write, in either order, and the blocks come back only then. */
static void test_c2_failure_then_completion(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1};
    uint64_t key = 99;
    OK(reg(&f, "cmpl-42-0", 7, 0, agents, 2, 0, &key));
    CHECK(key == 0);
    CHECK(feed(&f, 1, "PUSH_FAIL:cmpl-42-0:2") == KVDRAIN_NOTICE_COUNTED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 0); /* the failure waits for p0 */
    CHECK(feed(&f, 0, "cmpl-42-0:2") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, key, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, key, 7, 0);
    close_ledger(&f);
}

static void test_c2_completion_then_failure(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1};
    uint64_t named = 0, counting = 0;
    OK(reg(&f, "named", 7, 0, agents, 2, 0, &named));
    OK(reg(&f, "counting", 8, 2, NULL, 0, 0, &counting));
    CHECK(feed(&f, 0, "named:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 0, "counting:2") == KVDRAIN_NOTICE_COUNTED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 0);
    CHECK(feed(&f, 1, "PUSH_FAIL:named:2") == KVDRAIN_NOTICE_DECIDED);
    CHECK(feed(&f, 1, "PUSH_FAIL:counting:2") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 4, 1) == 4); /* room 1 per call: the queue keeps the rest */
    expect_decision(&d[0], KVDRAIN_FAILED, named, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, named, 7, 0);
    expect_decision(&d[2], KVDRAIN_FAILED, counting, 0, 0);
    expect_decision(&d[3], KVDRAIN_RELEASED, counting, 8, 0);
    kvdrain_ingest_counters ic;
    OK(kvdrain_ingest_get_counters(f.ingest, &ic));
    CHECK(ic.completions == 2 && ic.failure_notices == 2 && ic.last_edges == 2);
    kvdrain_engine_counters ec;
    OK(kvdrain_engine_get_counters(f.engine, &ec));
    CHECK(ec.failed == 2 && ec.released == 2 && ec.completed == 0);
    close_ledger(&f);
}

static void test_duplicates_and_unexpected_senders(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1};
    uint64_t named = 0, counting = 0;
    OK(reg(&f, "n", 1, 0, agents, 2, 0, &named));
    OK(reg(&f, "c", 2, 2, NULL, 0, 0, &counting));
    CHECK(feed(&f, 0, "n:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 0, "n:2") == KVDRAIN_IGNORED_DUPLICATE);
    CHECK(feed(&f, 0, "PUSH_FAIL:n:2") == KVDRAIN_IGNORED_DUPLICATE);
    CHECK(feed(&f, 5, "n:2") == KVDRAIN_IGNORED_UNEXPECTED_SENDER);
    /* Counting mode cannot tell a duplicate apart (rule 6): it counts. */
    CHECK(feed(&f, 0, "c:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 0, "c:2") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_COMPLETED, counting, 2, 0);
    CHECK(feed(&f, 1, "n:2") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_COMPLETED, named, 1, 0);
    kvdrain_ingest_counters ic;
    OK(kvdrain_ingest_get_counters(f.ingest, &ic));
    CHECK(ic.duplicate == 2 && ic.unexpected_sender == 1);
    close_ledger(&f);
}

static void test_unknown_and_late_ids(void) {
    fixture f = open_ledger(16, 30000, 60000);
    uint64_t key = 0;
    CHECK(feed(&f, 0, "early:1") == KVDRAIN_IGNORED_UNKNOWN); /* before register: no state */
    OK(reg(&f, "early", 3, 1, NULL, 0, 0, &key));
    kvdrain_decision d[2];
    CHECK(poll_all(&f, d, 2, 2) == 0);
    CHECK(feed(&f, 0, "early:1") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 2, 2) == 1);
    expect_decision(&d[0], KVDRAIN_COMPLETED, key, 3, 0);
    CHECK(feed(&f, 0, "early:1") == KVDRAIN_IGNORED_LATE);
    CHECK(feed(&f, 0, "never:1") == KVDRAIN_IGNORED_UNKNOWN);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 0 && info.live_keys == 0 && info.queued_decisions == 0);
    kvdrain_ingest_counters ic;
    OK(kvdrain_ingest_get_counters(f.ingest, &ic));
    CHECK(ic.unknown == 2 && ic.late == 1);
    close_ledger(&f);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void) {
    uint64_t x = rng_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static void test_garbage_changes_nothing_else(void) {
    fixture f = open_ledger(16, 30000, 60000);
    uint64_t key = 0;
    OK(reg(&f, "r", 5, 1, NULL, 0, 0, &key));
    CHECK(feed(&f, 0, "") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "garbage") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "r:0") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "r:65536") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "r:x") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "\xff\xfe:1") == KVDRAIN_IGNORED_MALFORMED);
    CHECK(feed(&f, 0, "HB:r") == KVDRAIN_IGNORED_NOT_FOR_CONSUMER);
    CHECK(feed(&f, 0, "PUSH_REG:\x81\xa1x") == KVDRAIN_IGNORED_NOT_FOR_CONSUMER);
    kvdrain_notice outcome;
    OK(kvdrain_ingest_feed(f.ingest, 0, NULL, 0, &outcome)); /* NULL, 0: an empty message */
    CHECK(outcome == KVDRAIN_IGNORED_MALFORMED);
    EXPECT(kvdrain_ingest_feed(f.ingest, 0, NULL, 3, &outcome), KVDRAIN_ERR_NULL);
    /* Random bytes, with the odd ':' and digits: nothing counts. */
    uint8_t buf[64];
    for (int i = 0; i < 20000; i++) {
        size_t len = next_random() % sizeof buf;
        for (size_t j = 0; j < len; j++) {
            uint64_t r = next_random();
            buf[j] = (r & 3) == 0 ? ':' : (r & 3) == 1 ? (uint8_t)('0' + r % 10) : (uint8_t)(r >> 8);
        }
        if (len >= 2 && buf[len - 2] == ':' && buf[len - 1] == '1') buf[len - 1] = 'x';
        OK(kvdrain_ingest_feed(f.ingest, (uint16_t)next_random(), buf, len, NULL));
    }
    kvdrain_decision d[2];
    CHECK(poll_all(&f, d, 2, 2) == 0);
    CHECK(feed(&f, 0, "r:1") == KVDRAIN_NOTICE_DECIDED); /* the tracked request is intact */
    CHECK(poll_all(&f, d, 2, 2) == 1);
    expect_decision(&d[0], KVDRAIN_COMPLETED, key, 5, 0);
    close_ledger(&f);
}

static void test_full_table_and_bad_registrations(void) {
    fixture f = open_ledger(2, 30000, 60000);
    uint64_t a = 0, b = 0, c = 0;
    OK(reg(&f, "a", 1, 1, NULL, 0, 0, &a));
    OK(reg(&f, "b", 2, 1, NULL, 0, 0, &b));
    EXPECT(reg(&f, "c", 3, 1, NULL, 0, 0, &c), KVDRAIN_ERR_FULL);
    EXPECT(reg(&f, "a", 1, 1, NULL, 0, 0, &c), KVDRAIN_ERR_DUPLICATE_ID);
    CHECK(feed(&f, 0, "a:1") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[2];
    CHECK(poll_all(&f, d, 2, 2) == 1);
    OK(reg(&f, "c", 3, 1, NULL, 0, 0, &c)); /* a's slot is free again */
    CHECK(c != a && c != b && (c & 0xFFFF) == (a & 0xFFFF)); /* keys carry their slot */
    kvdrain_engine_counters ec;
    OK(kvdrain_engine_get_counters(f.engine, &ec));
    CHECK(ec.rejected_full == 1 && ec.rejected_duplicate_id == 1 && ec.registered == 3);
    close_ledger(&f);

    f = open_ledger(16, 30000, 60000);
    const uint16_t twice[] = {3, 3};
    const uint16_t nine[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    uint16_t many[100];
    for (int i = 0; i < 100; i++) many[i] = (uint16_t)i;
    EXPECT(reg(&f, "x", 0, 0, NULL, 0, 0, NULL), KVDRAIN_ERR_BAD_COUNT);
    EXPECT(reg(&f, "x", 0, 65, NULL, 0, 0, NULL), KVDRAIN_ERR_BAD_COUNT);
    EXPECT(reg(&f, "x", 0, 257, NULL, 0, 0, NULL), KVDRAIN_ERR_BAD_COUNT); /* not 257 % 256 */
    EXPECT(reg(&f, "x", 0, 0, twice, 2, 0, NULL), KVDRAIN_ERR_BAD_EDGES);
    EXPECT(reg(&f, "x", 0, 0, nine, 9, 0, NULL), KVDRAIN_ERR_BAD_EDGES);
    EXPECT(reg(&f, "x", 0, 0, many, 100, 0, NULL), KVDRAIN_ERR_BAD_EDGES);
    EXPECT(reg(&f, "x", 0, 2, twice, 1, 0, NULL), KVDRAIN_ERR_INVALID); /* count and agents */
    EXPECT(reg(&f, "\xc3\x28", 0, 1, NULL, 0, 0, NULL), KVDRAIN_ERR_INVALID); /* not UTF-8 */
    EXPECT(reg(&f, "x", 0, 0, NULL, 2, 0, NULL), KVDRAIN_ERR_NULL);
    kvdrain_registration r = {.id = NULL, .id_len = 4, .count = 1};
    EXPECT(kvdrain_engine_register(f.engine, &r, NULL), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_register(f.engine, NULL, NULL), KVDRAIN_ERR_NULL);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 0);
    close_ledger(&f);

    kvdrain_config cfg;
    kvdrain_ledger *l = NULL;
    OK(kvdrain_config_default(0, &cfg));
    EXPECT(kvdrain_ledger_new(&cfg, &l), KVDRAIN_ERR_INVALID);
    cfg.capacity = KVDRAIN_MAX_CAPACITY + 1;
    EXPECT(kvdrain_ledger_new(&cfg, &l), KVDRAIN_ERR_INVALID);
    CHECK(l == NULL);
}

/* A refusal whose blocks producers may write into anyway (another rank let them): the
 * ledger's clock holds them a quarantine, rounded up to a 61st of it, and hands the ends
 * out in order, into an array; the caller's queue of handles follows the numbers. */
static void test_refused_hold(void) {
    fixture f = open_ledger(1, 30000, 1000); /* granule 17 ms */
    OK(reg(&f, "a", 1, 1, NULL, 0, 0, NULL));
    EXPECT(reg(&f, "b", 2, 1, NULL, 0, 0, NULL), KVDRAIN_ERR_FULL);
    OK(kvdrain_engine_advance(f.engine, 10));
    uint64_t queue[3] = {2, 3, 4};
    kvdrain_refused_hold h[3];
    OK(kvdrain_engine_hold_refused(f.engine, &h[0]));
    OK(kvdrain_engine_hold_refused(f.engine, &h[1]));
    OK(kvdrain_engine_advance(f.engine, 100));
    OK(kvdrain_engine_hold_refused(f.engine, NULL)); /* the hold without its end */
    CHECK(h[0].number == 0 && h[1].number == 1);
    CHECK(h[0].until_ms == 1020 && h[1].until_ms == 1020); /* 1010, up to 17 * 60 */
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 1 && info.next_timer_ms == 1020);
    size_t n = 3;
    OK(kvdrain_engine_advance(f.engine, 1019));
    OK(kvdrain_engine_poll_refused_releases(f.engine, h, &n));
    CHECK(n == 0);
    OK(kvdrain_engine_advance(f.engine, 1020));
    n = 1; /* room for one: the second waits */
    OK(kvdrain_engine_poll_refused_releases(f.engine, h, &n));
    CHECK(n == 1 && h[0].number == 0 && queue[h[0].number] == 2);
    n = 3;
    OK(kvdrain_engine_poll_refused_releases(f.engine, h, &n));
    CHECK(n == 1 && h[0].number == 1);
    OK(kvdrain_engine_advance(f.engine, 1105)); /* 1100 rounded up to 1105 */
    n = 3;
    OK(kvdrain_engine_poll_refused_releases(f.engine, h, &n));
    CHECK(n == 1 && h[0].number == 2 && h[0].until_ms == 1105 && queue[2] == 4);
    kvdrain_decision d[2];
    CHECK(poll_all(&f, d, 2, 2) == 0); /* no decision: a hold changes no request */
    n = 1;
    EXPECT(kvdrain_engine_poll_refused_releases(f.engine, NULL, &n), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_poll_refused_releases(f.engine, h, NULL), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_hold_refused(NULL, NULL), KVDRAIN_ERR_NULL);
    close_ledger(&f);
}

static void test_abort(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1};
    uint64_t key = 0, done = 0;
    OK(reg(&f, "r", 9, 0, agents, 2, 0, &key));
    CHECK(feed(&f, 0, "r:2") == KVDRAIN_NOTICE_COUNTED);
    kvdrain_quarantined q;
    OK(kvdrain_engine_abort(f.engine, key, &q));
    CHECK(q.key == key && q.cause == KVDRAIN_ABORTED && q.named == 1 && q.outstanding == 2);
    EXPECT(kvdrain_engine_abort(f.engine, key, &q), KVDRAIN_ERR_STALE); /* ticket used up */
    EXPECT(kvdrain_engine_abort(f.engine, 12345, &q), KVDRAIN_ERR_UNKNOWN);
    EXPECT(kvdrain_engine_abort_id(f.engine, (const uint8_t *)"zz", 2, &q), KVDRAIN_ERR_UNKNOWN);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 0); /* fenced until p1's write resolves */
    /* The late notice resolves the edge and releases, not reported as ignored. */
    CHECK(feed(&f, 1, "r:2") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, key, 9, 0);

    /* Decided first: the abort is late; the decision still comes out once. */
    OK(reg(&f, "s", 10, 1, NULL, 0, 0, &done));
    CHECK(feed(&f, 0, "s:1") == KVDRAIN_NOTICE_DECIDED);
    EXPECT(kvdrain_engine_abort(f.engine, done, &q), KVDRAIN_ERR_LATE);
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_COMPLETED, done, 10, 0);
    EXPECT(kvdrain_engine_abort(f.engine, done, NULL), KVDRAIN_ERR_STALE);
    EXPECT(kvdrain_engine_abort_id(f.engine, (const uint8_t *)"s", 1, NULL), KVDRAIN_ERR_LATE);

    /* By id; the key is then used up. */
    uint64_t t = 0;
    OK(reg(&f, "t", 11, 3, NULL, 0, 0, &t));
    OK(kvdrain_engine_abort_id(f.engine, (const uint8_t *)"t", 1, &q));
    CHECK(q.key == t && q.named == 0 && q.outstanding == 3);
    EXPECT(kvdrain_engine_abort(f.engine, t, NULL), KVDRAIN_ERR_STALE);
    /* Quarantine ends: forced release. */
    OK(kvdrain_engine_advance(f.engine, 60000));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, t, 11, 1);
    close_ledger(&f);
}

static void test_deadline(void) {
    fixture f = open_ledger(16, 100, 1000);
    uint64_t slow = 0, quick = 0;
    OK(reg(&f, "slow", 1, 2, NULL, 0, 0, &slow));
    OK(reg(&f, "quick", 2, 0, (const uint16_t[]){4, 5}, 2, 10, &quick));
    CHECK(feed(&f, 5, "quick:2") == KVDRAIN_NOTICE_COUNTED);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.next_timer_ms == 10);
    kvdrain_decision d[4];
    OK(kvdrain_engine_advance(f.engine, 9));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 10));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    CHECK(d[0].kind == KVDRAIN_EXPIRED && d[0].key == quick && d[0].named == 1);
    CHECK(d[0].outstanding == 1); /* agent 4, the first listed, still owes */
    OK(kvdrain_engine_advance(f.engine, 99));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 100));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    CHECK(d[0].kind == KVDRAIN_EXPIRED && d[0].key == slow && d[0].named == 0);
    CHECK(d[0].outstanding == 2);
    EXPECT(kvdrain_engine_advance(f.engine, 50), KVDRAIN_ERR_CLOCK_BACKWARDS);
    EXPECT(kvdrain_engine_abort(f.engine, slow, NULL), KVDRAIN_ERR_STALE);
    CHECK(feed(&f, 0, "slow:2") == KVDRAIN_NOTICE_COUNTED); /* late, still resolves its edge */
    OK(kvdrain_engine_advance(f.engine, 1100));
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_RELEASED, slow, 1, 1); /* registration order */
    expect_decision(&d[1], KVDRAIN_RELEASED, quick, 2, 1);
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.next_timer_ms == KVDRAIN_NO_TIMER && info.now_ms == 1100 && info.tracked == 0);
    close_ledger(&f);
}

static void test_fence(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1};
    uint64_t named = 0, counting = 0;
    OK(reg(&f, "named", 3, 0, agents, 2, 0, &named));
    OK(reg(&f, "counting", 4, 2, NULL, 0, 0, &counting));
    CHECK(feed(&f, 0, "named:2") == KVDRAIN_NOTICE_COUNTED);
    uint32_t resolved = 99;
    OK(kvdrain_engine_fence(f.engine, 1, &resolved));
    CHECK(resolved == 1); /* counting mode is not touched */
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, named, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, named, 3, 0);
    CHECK(feed(&f, 1, "named:2") == KVDRAIN_IGNORED_LATE);
    OK(kvdrain_engine_fence(f.engine, 1, NULL));
    kvdrain_engine_counters ec;
    OK(kvdrain_engine_get_counters(f.engine, &ec));
    CHECK(ec.fenced_edges == 1);
    close_ledger(&f);
}

/* Rule 8: the blocks of a failed request stay fenced settle_ms after its last failure
 * notice. */
static void test_settling(void) {
    kvdrain_config cfg;
    OK(kvdrain_config_default(16, &cfg));
    cfg.deadline_ms = 1000;
    cfg.settle_ms = 100;
    fixture f = open_with(&cfg);
    const uint16_t agents[] = {0, 1};
    uint64_t key = 0;
    OK(reg(&f, "r1", 7, 0, agents, 2, 0, &key));
    CHECK(feed(&f, 1, "PUSH_FAIL:r1:2") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_advance(f.engine, 5));
    CHECK(feed(&f, 0, "r1:2") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_FAILED, key, 0, 0);
    OK(kvdrain_engine_advance(f.engine, 99));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 100));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, key, 7, 0);
    close_ledger(&f);
}

/* Rule 8 across a slow engine step: steps at 0 and 10, then the ingest thread takes a
 * PUSH_FAIL at 600 and says so (kvdrain_ingest_set_arrival): the blocks settle until
 * 600 + 500, not 10 + 500, so they are not released in the step that sees the failure.
 * An earlier arrival than one given is ignored; without one, the last advance dates. */
static void test_settling_from_arrival(void) {
    kvdrain_config cfg;
    OK(kvdrain_config_default(16, &cfg));
    cfg.deadline_ms = 100000;
    cfg.settle_ms = 500;
    fixture f = open_with(&cfg);
    const uint16_t agents[] = {0, 1};
    uint64_t late = 0, plain = 0;
    OK(reg(&f, "slow", 7, 0, agents, 2, 0, &late));
    OK(reg(&f, "plain", 8, 0, agents, 2, 0, &plain));
    OK(kvdrain_engine_advance(f.engine, 0));
    OK(kvdrain_engine_advance(f.engine, 10));
    CHECK(feed(&f, 0, "plain:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 1, "PUSH_FAIL:plain:2") == KVDRAIN_NOTICE_DECIDED); /* dated 10 */
    OK(kvdrain_ingest_set_arrival(f.ingest, 600));
    OK(kvdrain_ingest_set_arrival(f.ingest, 300)); /* earlier: ignored */
    CHECK(feed(&f, 0, "slow:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 1, "PUSH_FAIL:slow:2") == KVDRAIN_NOTICE_DECIDED); /* dated 600 */
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, plain, 0, 0);
    expect_decision(&d[1], KVDRAIN_FAILED, late, 0, 0);
    OK(kvdrain_engine_advance(f.engine, 510));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, plain, 8, 0);
    OK(kvdrain_engine_advance(f.engine, 600));
    CHECK(poll_all(&f, d, 4, 4) == 0); /* not in the step that saw it */
    OK(kvdrain_engine_advance(f.engine, 1099));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 1100));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, late, 7, 0);
    EXPECT(kvdrain_ingest_set_arrival(NULL, 600), KVDRAIN_ERR_NULL);
    close_ledger(&f);
}

static fixture open_settling(uint32_t capacity, uint64_t quarantine_ms, uint64_t settle_ms) {
    kvdrain_config cfg;
    OK(kvdrain_config_default(capacity, &cfg));
    cfg.deadline_ms = 1000;
    cfg.quarantine_ms = quarantine_ms;
    cfg.settle_ms = settle_ms;
    return open_with(&cfg);
}

/* Rule 9: a producer seen gone fails its named edges at once, as failure notices from it
 * would, and their blocks settle settle_ms from the gone; counting mode, edges already
 * resolved and an aborted request's quarantine behave as for a failure notice. */
static void test_gone(void) {
    fixture f = open_settling(16, 1000, 100);
    const uint16_t agents[] = {0, 1};
    uint64_t named = 0, counting = 0, aborted = 0;
    OK(reg(&f, "named", 3, 0, agents, 2, 0, &named));
    OK(reg(&f, "counting", 4, 2, NULL, 0, 0, &counting));
    OK(reg(&f, "aborted", 5, 0, agents + 1, 1, 0, &aborted));
    CHECK(feed(&f, 0, "named:2") == KVDRAIN_NOTICE_COUNTED);
    kvdrain_quarantined q;
    OK(kvdrain_engine_abort(f.engine, aborted, &q));
    OK(kvdrain_engine_advance(f.engine, 20));
    uint32_t resolved = 99;
    OK(kvdrain_engine_gone(f.engine, 1, &resolved));
    CHECK(resolved == 2); /* named and aborted; counting mode is not touched */
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_FAILED, named, 0, 0); /* failed now, not released */
    CHECK(feed(&f, 1, "named:2") == KVDRAIN_IGNORED_LATE);
    OK(kvdrain_engine_gone(f.engine, 1, &resolved));
    CHECK(resolved == 0); /* already resolved: left as it is */
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.next_timer_ms == 120); /* the settle end: 20 + 100 */
    OK(kvdrain_engine_advance(f.engine, 119));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 120));
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_RELEASED, named, 3, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, aborted, 5, 0);
    kvdrain_engine_counters ec;
    OK(kvdrain_engine_get_counters(f.engine, &ec));
    CHECK(ec.gone_edges == 2 && ec.fenced_edges == 0);
    CHECK(ec.settle_started == 2 && ec.settle_released == 2 && ec.settling == 0);
    close_ledger(&f);
}

/* Rule 7 with rule 8: a request waiting to settle holds its slot until its release. */
static void test_settling_holds_its_slot(void) {
    fixture f = open_settling(1, 60000, 100);
    uint64_t r = 0, s = 0;
    OK(reg(&f, "r", 1, 1, NULL, 0, 0, &r));
    CHECK(feed(&f, 0, "PUSH_FAIL:r:1") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_FAILED, r, 0, 0);
    EXPECT(reg(&f, "s", 2, 1, NULL, 0, 0, &s), KVDRAIN_ERR_FULL);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 1 && info.next_timer_ms == 100);
    OK(kvdrain_engine_advance(f.engine, 100));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, r, 1, 0);
    OK(reg(&f, "s", 2, 1, NULL, 0, 0, &s)); /* free once settled */
    close_ledger(&f);
}

/* The settle end counts from the last failure notice; one already passed when the last
 * edge resolves releases with the failure. */
static void test_settling_counts_from_the_last_notice(void) {
    fixture f = open_settling(16, 60000, 100);
    uint64_t r = 0, s = 0;
    OK(reg(&f, "r", 3, 2, NULL, 0, 0, &r));
    CHECK(feed(&f, 0, "PUSH_FAIL:r:1") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_advance(f.engine, 50));
    CHECK(feed(&f, 1, "PUSH_FAIL:r:1") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_FAILED, r, 0, 0);
    OK(kvdrain_engine_advance(f.engine, 149));
    CHECK(poll_all(&f, d, 4, 4) == 0);
    OK(kvdrain_engine_advance(f.engine, 150));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, r, 3, 0);

    OK(reg(&f, "s", 4, 2, NULL, 0, 0, &s));
    CHECK(feed(&f, 0, "PUSH_FAIL:s:1") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_advance(f.engine, 250));
    CHECK(feed(&f, 1, "s:1") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, s, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, s, 4, 0);
    close_ledger(&f);
}

/* One request with edge agent 0, aborted at 0 (or expired at its deadline 0), whose edge
 * a failure notice resolves at `notice_at`; returns its key. */
static uint64_t quarantined_with_notice(fixture *f, int expire, uint64_t notice_at) {
    const uint16_t agent = 0;
    uint64_t key = 0;
    kvdrain_decision d[4];
    if (expire) {
        /* deadline 0 means "the default": use 1 ms and start the clock there. */
        OK(reg(f, "q", 5, 0, &agent, 1, 1, &key));
        OK(kvdrain_engine_advance(f->engine, 1));
        CHECK(poll_all(f, d, 4, 4) == 1);
        CHECK(d[0].kind == KVDRAIN_EXPIRED && d[0].key == key);
    } else {
        OK(kvdrain_engine_advance(f->engine, 1));
        OK(reg(f, "q", 5, 0, &agent, 1, 0, &key));
        OK(kvdrain_engine_abort(f->engine, key, NULL));
    }
    OK(kvdrain_engine_advance(f->engine, notice_at));
    CHECK(feed(f, 0, "PUSH_FAIL:q:1") == KVDRAIN_NOTICE_DECIDED);
    CHECK(poll_all(f, d, 4, 4) == 0); /* settling; the quarantine still runs */
    return key;
}

/* Abort/expiry: the release comes at the settle end or the quarantine end, whichever is
 * first; the quarantine is not delayed by settling; on a tie the settle end wins
 * (forced = 0). Quarantine starts at 1 (the abort or the deadline). */
static void test_settling_against_quarantine(void) {
    kvdrain_decision d[4];
    for (int expire = 0; expire <= 1; expire++) {
        /* settle end 111 before quarantine end 501 */
        fixture f = open_settling(16, 500, 100);
        uint64_t key = quarantined_with_notice(&f, expire, 11);
        OK(kvdrain_engine_advance(f.engine, 110));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        OK(kvdrain_engine_advance(f.engine, 111));
        CHECK(poll_all(&f, d, 4, 4) == 1);
        expect_decision(&d[0], KVDRAIN_RELEASED, key, 5, 0);
        OK(kvdrain_engine_advance(f.engine, 600));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        close_ledger(&f);

        /* quarantine end 101 before settle end 151 */
        f = open_settling(16, 100, 100);
        key = quarantined_with_notice(&f, expire, 51);
        OK(kvdrain_engine_advance(f.engine, 100));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        OK(kvdrain_engine_advance(f.engine, 101));
        CHECK(poll_all(&f, d, 4, 4) == 1);
        expect_decision(&d[0], KVDRAIN_RELEASED, key, 5, 1);
        OK(kvdrain_engine_advance(f.engine, 200));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        close_ledger(&f);

        /* tie at 101: settle end 61 + 40 = quarantine end 1 + 100 */
        f = open_settling(16, 100, 40);
        key = quarantined_with_notice(&f, expire, 61);
        OK(kvdrain_engine_advance(f.engine, 100));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        OK(kvdrain_engine_advance(f.engine, 101));
        CHECK(poll_all(&f, d, 4, 4) == 1);
        expect_decision(&d[0], KVDRAIN_RELEASED, key, 5, 0);
        OK(kvdrain_engine_advance(f.engine, 1000));
        CHECK(poll_all(&f, d, 4, 4) == 0);
        close_ledger(&f);
    }
}

/* settle_ms = 0 is vLLM's failure notice: the release comes with the failure. */
static void test_settle_zero_is_vllm(void) {
    fixture f = open_settling(1, 60000, 0);
    const uint16_t agents[] = {0, 1};
    uint64_t r = 0;
    OK(reg(&f, "r", 8, 0, agents, 2, 0, &r));
    CHECK(feed(&f, 1, "PUSH_FAIL:r:2") == KVDRAIN_NOTICE_COUNTED);
    CHECK(feed(&f, 0, "r:2") == KVDRAIN_NOTICE_DECIDED);
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, r, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, r, 8, 0);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 0 && info.next_timer_ms == KVDRAIN_NO_TIMER);
    OK(reg(&f, "s", 9, 1, NULL, 0, 0, NULL)); /* the slot is free at once */
    close_ledger(&f);
}

/* Decisions wait in the core until polled, in the order they were taken, however small
 * the caller's array; a request decided and not polled keeps its key's ticket, so a caller
 * that polls late can be refused FULL with nothing tracked. */
static void test_late_poll(void) {
    fixture f = open_ledger(4, 10, 10);
    kvdrain_decision d[64];
    char id[32];
    uint64_t keys[4];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++) {
            snprintf(id, sizeof id, "q%d-%d", round, i);
            OK(reg(&f, id, (uint64_t)i, 1, NULL, 0, 0, &keys[i]));
        }
        uint64_t t = 20 * (uint64_t)round;
        OK(kvdrain_engine_advance(f.engine, t + 10)); /* every deadline */
        OK(kvdrain_engine_advance(f.engine, t + 20)); /* every quarantine end */
        kvdrain_engine_info info;
        OK(kvdrain_engine_get_info(f.engine, &info));
        CHECK(info.queued_decisions == 8);
        CHECK(info.tracked == 0);
        EXPECT(reg(&f, "late", 9, 1, NULL, 0, 0, NULL), KVDRAIN_ERR_FULL);
        CHECK(poll_all(&f, d, 64, 3) == 8);
        for (int i = 0; i < 4; i++) {
            CHECK(d[i].kind == KVDRAIN_EXPIRED && d[i].key == keys[i]);
            CHECK(d[i].outstanding == 1);
            expect_decision(&d[4 + i], KVDRAIN_RELEASED, keys[i], (uint64_t)i, 1);
        }
        OK(kvdrain_engine_get_info(f.engine, &info));
        CHECK(info.queued_decisions == 0);
    }
    close_ledger(&f);
}

static void test_batch_feed(void) {
    fixture f = open_ledger(16, 30000, 60000);
    const uint16_t agents[] = {0, 1, 2};
    uint64_t k1 = 0, k2 = 0;
    OK(reg(&f, "b1", 1, 0, agents, 3, 0, &k1));
    OK(reg(&f, "b2", 2, 3, NULL, 0, 0, &k2));
    /* What TensorRT-LLM's unordered_map<sender, vector<message>> flattens into. */
    const char *texts[] = {"b1:3", "b2:3", "b1:3", "b2:3", "junk", "b1:3", "PUSH_FAIL:b2:3"};
    const uint16_t senders[] = {0, 0, 1, 1, 1, 2, 2};
    const uint8_t *msgs[7];
    size_t lens[7];
    for (int i = 0; i < 7; i++) {
        msgs[i] = (const uint8_t *)texts[i];
        lens[i] = strlen(texts[i]);
    }
    /* A bad entry anywhere: nothing is fed. */
    const uint8_t *bad_msgs[7];
    memcpy(bad_msgs, msgs, sizeof msgs);
    bad_msgs[6] = NULL;
    size_t decided = 99;
    EXPECT(kvdrain_ingest_feed_batch(f.ingest, 7, senders, bad_msgs, lens, NULL, &decided),
           KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_ingest_feed_batch(f.ingest, 7, NULL, msgs, lens, NULL, &decided), KVDRAIN_ERR_NULL);
    kvdrain_ingest_counters ic;
    OK(kvdrain_ingest_get_counters(f.ingest, &ic));
    CHECK(ic.completions == 0 && ic.malformed == 0);
    kvdrain_notice outcomes[7];
    OK(kvdrain_ingest_feed_batch(f.ingest, 7, senders, msgs, lens, outcomes, &decided));
    CHECK(decided == 2);
    CHECK(outcomes[4] == KVDRAIN_IGNORED_MALFORMED);
    CHECK(outcomes[5] == KVDRAIN_NOTICE_DECIDED && outcomes[6] == KVDRAIN_NOTICE_DECIDED);
    OK(kvdrain_ingest_feed_batch(f.ingest, 0, NULL, NULL, NULL, NULL, NULL));
    kvdrain_decision d[4];
    CHECK(poll_all(&f, d, 4, 4) == 3);
    expect_decision(&d[0], KVDRAIN_COMPLETED, k1, 1, 0);
    expect_decision(&d[1], KVDRAIN_FAILED, k2, 0, 0);
    expect_decision(&d[2], KVDRAIN_RELEASED, k2, 2, 0);
    close_ledger(&f);
}

static void test_handles_nulls_and_misuse(void) {
    kvdrain_config cfg;
    EXPECT(kvdrain_config_default(8, NULL), KVDRAIN_ERR_NULL);
    OK(kvdrain_config_default(8, &cfg));
    CHECK(cfg.capacity == 8 && cfg.deadline_ms == 30000 && cfg.quarantine_ms == 60000);
    CHECK(cfg.settle_ms == 5000);
    kvdrain_ledger *l = NULL;
    EXPECT(kvdrain_ledger_new(NULL, &l), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_ledger_new(&cfg, NULL), KVDRAIN_ERR_NULL);
    kvdrain_ledger_free(NULL);
    kvdrain_ingest_free(NULL);
    kvdrain_engine_free(NULL);
    kvdrain_push_plan_free(NULL);

    kvdrain_ingest *in = NULL;
    kvdrain_engine *en = NULL;
    EXPECT(kvdrain_ledger_split(NULL, &in, &en), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_ingest_feed(NULL, 0, (const uint8_t *)"a:1", 3, NULL), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_advance(NULL, 0), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_poll(NULL, NULL, NULL), KVDRAIN_ERR_NULL);

    OK(kvdrain_ledger_new(&cfg, &l));
    EXPECT(kvdrain_ledger_split(l, NULL, &en), KVDRAIN_ERR_NULL);
    OK(kvdrain_ledger_split(l, &in, &en));
    kvdrain_ingest *in2 = NULL;
    kvdrain_engine *en2 = NULL;
    EXPECT(kvdrain_ledger_split(l, &in2, &en2), KVDRAIN_ERR_BUSY);
    CHECK(in2 == NULL && en2 == NULL);
    size_t n = 1;
    EXPECT(kvdrain_engine_poll(en, NULL, &n), KVDRAIN_ERR_NULL);
    n = 0;
    OK(kvdrain_engine_poll(en, NULL, &n));
    CHECK(n == 0);
    kvdrain_decision one;
    n = SIZE_MAX; /* a room no array can have */
    EXPECT(kvdrain_engine_poll(en, &one, &n), KVDRAIN_ERR_INVALID);
    EXPECT(kvdrain_engine_get_counters(en, NULL), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_ingest_get_counters(in, NULL), KVDRAIN_ERR_NULL);

    /* A freed half is detected while its ledger lives; a second free does nothing. */
    kvdrain_ingest_free(in);
    EXPECT(kvdrain_ingest_feed(in, 0, (const uint8_t *)"a:1", 3, NULL), KVDRAIN_ERR_FREED);
    kvdrain_ingest_free(in);
    /* The engine of a freed ledger refuses calls; the memory goes with the engine. */
    kvdrain_ledger_free(l);
    EXPECT(kvdrain_engine_advance(en, 1), KVDRAIN_ERR_FREED);
    EXPECT(kvdrain_ledger_split(l, &in2, &en2), KVDRAIN_ERR_FREED);
    kvdrain_engine_free(en);

    /* Any free order: the engine first, then the ledger, the ingest half last. */
    OK(kvdrain_ledger_new(&cfg, &l));
    OK(kvdrain_ledger_split(l, &in, &en));
    kvdrain_engine_free(en);
    kvdrain_ledger_free(l);
    EXPECT(kvdrain_ingest_feed(in, 0, (const uint8_t *)"a:1", 3, NULL), KVDRAIN_ERR_FREED);
    kvdrain_ingest_free(in);
    /* A ledger never split is freed by its handle alone. */
    OK(kvdrain_ledger_new(&cfg, &l));
    kvdrain_ledger_free(l);

    for (uint32_t s = 0; s <= KVDRAIN_ERR_RETIRED; s++) {
        const char *text = kvdrain_status_str(s);
        CHECK(text != NULL && strlen(text) > 0 && strcmp(text, "unknown status") != 0);
    }
    CHECK(strcmp(kvdrain_status_str(KVDRAIN_OK), "ok") == 0);
    CHECK(strcmp(kvdrain_status_str(9999), "unknown status") == 0);
    /* One version: the header's macros are what the library says at run time
     * (c-test.sh checks KVDRAIN_VERSION against the crate's version). */
    const char *version = kvdrain_version();
    CHECK(version != NULL && strcmp(version, KVDRAIN_VERSION) == 0);
    char parts[32];
    snprintf(parts, sizeof parts, "%d.%d.%d", KVDRAIN_VERSION_MAJOR, KVDRAIN_VERSION_MINOR,
             KVDRAIN_VERSION_PATCH);
    CHECK(strcmp(parts, version) == 0);
}

static size_t owed(kvdrain_push_plan *p, kvdrain_owed_notice *out, size_t room) {
    size_t n = room;
    OK(kvdrain_push_plan_owed(p, out, &n));
    return n;
}

static void test_producer_owed_notices(void) {
    /* P TP=1 writes into 4 D ranks (head slices); rank 1 cannot be posted, the loop
     * unwinds before ranks 2 and 3. */
    kvdrain_topology topo = {.p_tp = 1, .p_pp = 1, .d_tp = 4, .mla = 0};
    kvdrain_push_plan *p = NULL;
    OK(kvdrain_push_plan_new(&topo, 0, 0, &p));
    OK(kvdrain_push_plan_may_post(p, 0));
    OK(kvdrain_push_plan_posted(p, 0));
    OK(kvdrain_push_plan_post_failed(p, 1));
    OK(kvdrain_push_plan_retire(p));
    EXPECT(kvdrain_push_plan_may_post(p, 2), KVDRAIN_ERR_RETIRED);
    EXPECT(kvdrain_push_plan_posted(p, 9), KVDRAIN_ERR_RETIRED);
    kvdrain_owed_notice o[8];
    size_t n = 2;
    EXPECT(kvdrain_push_plan_owed(p, o, &n), KVDRAIN_ERR_BUFFER_TOO_SMALL);
    CHECK(n == 3);
    CHECK(owed(p, o, 8) == 3);
    CHECK(o[0].d_rank == 1 && o[1].d_rank == 2 && o[2].d_rank == 3);
    CHECK(o[0].posted == 0 && o[1].posted == 0 && o[2].posted == 0);
    bool terminal = true, all_landed = true;
    OK(kvdrain_push_plan_state(p, &terminal, &all_landed));
    CHECK(!terminal && !all_landed); /* rank 0 still in flight: keep the source blocks */
    OK(kvdrain_push_plan_landed(p, 0));
    OK(kvdrain_push_plan_state(p, &terminal, NULL));
    CHECK(terminal);
    for (uint16_t r = 1; r <= 3; r++) OK(kvdrain_push_plan_noticed(p, r));
    CHECK(owed(p, o, 8) == 0);
    EXPECT(kvdrain_push_plan_noticed(p, 1), KVDRAIN_ERR_WRONG_STATE);
    kvdrain_push_plan_free(p);

    /* A write that fails after posting owes a notice marked posted; an unreachable rank
     * owes none. */
    topo = (kvdrain_topology){.p_tp = 1, .p_pp = 1, .d_tp = 2, .mla = 1};
    OK(kvdrain_push_plan_new(&topo, 0, 0, &p));
    OK(kvdrain_push_plan_posted(p, 0));
    OK(kvdrain_push_plan_failed(p, 0));
    OK(kvdrain_push_plan_unreachable(p, 1));
    EXPECT(kvdrain_push_plan_landed(p, 0), KVDRAIN_ERR_WRONG_STATE);
    EXPECT(kvdrain_push_plan_posted(p, 7), KVDRAIN_ERR_UNKNOWN);
    CHECK(owed(p, o, 8) == 1);
    CHECK(o[0].d_rank == 0 && o[0].posted == 1);
    kvdrain_push_plan_free(p);

    topo.d_tp = 3;
    topo.p_tp = 2;
    EXPECT(kvdrain_push_plan_new(&topo, 0, 0, &p), KVDRAIN_ERR_INVALID);
    EXPECT(kvdrain_push_plan_new(NULL, 0, 0, &p), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_push_plan_retire(NULL), KVDRAIN_ERR_NULL);

    /* Only Success proves a posted write over, only a backend error bounds it: a write
     * whose status is unknown owes nothing and keeps the plan non-terminal. */
    topo = (kvdrain_topology){.p_tp = 1, .p_pp = 1, .d_tp = 4, .mla = 0};
    OK(kvdrain_push_plan_new(&topo, 0, 0, &p));
    for (uint16_t r = 0; r < 3; r++) OK(kvdrain_push_plan_posted(p, r));
    OK(kvdrain_push_plan_status_unknown(p, 0));
    OK(kvdrain_push_plan_status_unknown(p, 0)); /* repeated: no-op */
    OK(kvdrain_push_plan_status_unknown(p, 1));
    OK(kvdrain_push_plan_status_unknown(p, 2));
    OK(kvdrain_push_plan_retire(p)); /* rank 3 never attempted: owed at once */
    kvdrain_edge_state st = KVDRAIN_EDGE_PLANNED;
    OK(kvdrain_push_plan_edge_state(p, 0, &st));
    CHECK(st == KVDRAIN_EDGE_UNKNOWN);
    OK(kvdrain_push_plan_edge_state(p, 3, &st));
    CHECK(st == KVDRAIN_EDGE_FAILED_UNPOSTED);
    EXPECT(kvdrain_push_plan_edge_state(p, 9, &st), KVDRAIN_ERR_UNKNOWN);
    EXPECT(kvdrain_push_plan_edge_state(p, 0, NULL), KVDRAIN_ERR_NULL);
    CHECK(owed(p, o, 8) == 1);
    CHECK(o[0].d_rank == 3 && o[0].posted == 0);
    OK(kvdrain_push_plan_noticed(p, 3));
    OK(kvdrain_push_plan_state(p, &terminal, &all_landed));
    CHECK(!terminal && !all_landed); /* unknown writes: the source blocks stay fenced */
    EXPECT(kvdrain_push_plan_landed(p, 0), KVDRAIN_ERR_WRONG_STATE);
    EXPECT(kvdrain_push_plan_noticed(p, 0), KVDRAIN_ERR_WRONG_STATE); /* nothing owed */
    EXPECT(kvdrain_push_plan_unreachable(p, 0), KVDRAIN_ERR_WRONG_STATE);
    /* A backend error (this write's or another to the same peer) bounds an unknown write:
     * one notice, marked posted. */
    OK(kvdrain_push_plan_backend_error(p, 0));
    CHECK(owed(p, o, 8) == 1);
    CHECK(o[0].d_rank == 0 && o[0].posted == 1);
    OK(kvdrain_push_plan_edge_state(p, 0, &st));
    CHECK(st == KVDRAIN_EDGE_FAILED_POSTED);
    /* Success after all: landed, nothing owed. */
    OK(kvdrain_push_plan_landed_after_unknown(p, 1));
    OK(kvdrain_push_plan_edge_state(p, 1, &st));
    CHECK(st == KVDRAIN_EDGE_LANDED);
    EXPECT(kvdrain_push_plan_backend_error(p, 1), KVDRAIN_ERR_WRONG_STATE); /* final */
    OK(kvdrain_push_plan_state(p, &terminal, NULL));
    CHECK(!terminal); /* rank 2 still unknown */
    OK(kvdrain_push_plan_landed_after_unknown(p, 2));
    OK(kvdrain_push_plan_state(p, &terminal, &all_landed));
    CHECK(terminal && !all_landed);
    CHECK(owed(p, o, 8) == 1); /* only rank 0's */
    OK(kvdrain_push_plan_noticed(p, 0));
    CHECK(owed(p, o, 8) == 0);
    kvdrain_push_plan_free(p);

    /* landed_after_unknown also accepts a plainly posted write; status_unknown needs one. */
    topo = (kvdrain_topology){.p_tp = 1, .p_pp = 1, .d_tp = 1, .mla = 0};
    OK(kvdrain_push_plan_new(&topo, 0, 0, &p));
    EXPECT(kvdrain_push_plan_status_unknown(p, 0), KVDRAIN_ERR_WRONG_STATE);
    EXPECT(kvdrain_push_plan_backend_error(p, 0), KVDRAIN_ERR_WRONG_STATE);
    OK(kvdrain_push_plan_posted(p, 0));
    OK(kvdrain_push_plan_landed_after_unknown(p, 0));
    OK(kvdrain_push_plan_state(p, &terminal, &all_landed));
    CHECK(terminal && all_landed);
    kvdrain_push_plan_free(p);
    EXPECT(kvdrain_push_plan_status_unknown(NULL, 0), KVDRAIN_ERR_NULL);

    /* The notice's bytes, fed to a consumer. */
    uint8_t buf[64];
    size_t len = 4;
    EXPECT(kvdrain_encode_failure_notice((const uint8_t *)"r1", 2, 2, buf, &len),
           KVDRAIN_ERR_BUFFER_TOO_SMALL);
    CHECK(len == strlen("PUSH_FAIL:r1:2"));
    len = sizeof buf;
    OK(kvdrain_encode_failure_notice((const uint8_t *)"r1", 2, 2, buf, &len));
    CHECK(len == 14 && memcmp(buf, "PUSH_FAIL:r1:2", 14) == 0);
    len = sizeof buf;
    EXPECT(kvdrain_encode_failure_notice((const uint8_t *)"", 0, 2, buf, &len), KVDRAIN_ERR_INVALID);
    EXPECT(kvdrain_encode_failure_notice((const uint8_t *)"r1", 2, 0, buf, &len), KVDRAIN_ERR_INVALID);
    fixture f = open_ledger(4, 30000, 60000);
    uint64_t key = 0;
    OK(reg(&f, "r1", 6, 0, (const uint16_t[]){0, 1}, 2, 0, &key));
    len = sizeof buf;
    OK(kvdrain_encode_failure_notice((const uint8_t *)"r1", 2, 2, buf, &len));
    kvdrain_notice outcome;
    OK(kvdrain_ingest_feed(f.ingest, 1, buf, len, &outcome));
    CHECK(outcome == KVDRAIN_NOTICE_COUNTED);
    close_ledger(&f);
}

/* ---- two threads: the ingest thread feeds while the engine thread registers and polls ---- */

enum { TWO_THREAD_REQUESTS = 100000, TWO_THREAD_CAPACITY = 4096, ABORT_LAG = 24 };

typedef struct {
    kvdrain_ingest *ingest;
    _Atomic uint64_t registered; /* requests 0..registered-1 are registered */
    int bad;
} shared_run;

/* Every 11th request is aborted by the engine thread right after it is registered, while
 * the ingest thread may already be feeding it: abort and the last notice race. */
static int is_raced(uint64_t i) { return i % 11 == 5; }

static void request_id(char *out, size_t cap, uint64_t i) { snprintf(out, cap, "req-%llu", (unsigned long long)i); }

/* Feeds without touching the shared check counters (this runs on the ingest thread). */
static kvdrain_notice feed_quiet(kvdrain_ingest *ingest, uint16_t agent, const char *msg) {
    kvdrain_notice outcome = (kvdrain_notice)99;
    if (kvdrain_ingest_feed(ingest, agent, (const uint8_t *)msg, strlen(msg), &outcome) != KVDRAIN_OK)
        return (kvdrain_notice)98;
    return outcome;
}

static void *ingest_thread(void *arg) {
    shared_run *run = arg;
    char id[32];
    uint64_t fed = 0;
    while (fed < TWO_THREAD_REQUESTS) {
        uint64_t ready = atomic_load_explicit(&run->registered, memory_order_acquire);
        if (ready == fed) {
            sched_yield();
            continue;
        }
        for (; fed < ready; fed++) {
            request_id(id, sizeof id, fed);
            /* Every 7th request: agent 1 could not post (C2), before or after agent 0's
             * completion in turn. Between the two edges: an unknown id and a duplicate. */
            int fails = fed % 7 == 3;
            int fail_first = fails && fed % 2 == 0;
            char first[64], second[64];
            uint16_t first_agent = fail_first ? 1 : 0;
            uint16_t second_agent = fail_first ? 0 : 1;
            snprintf(first, sizeof first, "%s%s:2", fail_first ? "PUSH_FAIL:" : "", id);
            snprintf(second, sizeof second, "%s%s:2", fails && !fail_first ? "PUSH_FAIL:" : "", id);
            kvdrain_notice o1 = feed_quiet(run->ingest, first_agent, first);
            if (feed_quiet(run->ingest, 0, "nobody:2") != KVDRAIN_IGNORED_UNKNOWN) run->bad++;
            kvdrain_notice dup = feed_quiet(run->ingest, first_agent, first);
            kvdrain_notice o2 = feed_quiet(run->ingest, second_agent, second);
            if (is_raced(fed)) {
                /* The engine thread may abort it at any point: only no error is certain. */
                if (o1 == 98 || dup == 98 || o2 == 98) run->bad++;
            } else if (o1 != KVDRAIN_NOTICE_COUNTED || dup != KVDRAIN_IGNORED_DUPLICATE ||
                       o2 != KVDRAIN_NOTICE_DECIDED) {
                run->bad++;
            }
        }
    }
    return NULL;
}

static void test_two_threads(void) {
    fixture f = open_ledger(TWO_THREAD_CAPACITY, 1000000000, 1000000000);
    shared_run run = {.ingest = f.ingest, .registered = 0, .bad = 0};
    /* Per request: bit 0 decided for the client (COMPLETED, FAILED, or aborted), bit 1
     * blocks back (RELEASED), bit 2 aborted, bit 3 abort refused as LATE. */
    uint8_t *seen = calloc(TWO_THREAD_REQUESTS, 1);
    uint64_t *keys = calloc(TWO_THREAD_REQUESTS, sizeof *keys);
    CHECK(seen != NULL && keys != NULL);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, ingest_thread, &run) == 0);
    const uint16_t agents[] = {0, 1};
    char id[32];
    uint64_t registered = 0, completed = 0, failed = 0, aborted = 0, late = 0, released = 0;
    uint64_t anomalies = 0, next_abort = 0;
    kvdrain_decision d[256];
    /* Slots come back with COMPLETED and RELEASED; aborted requests hold theirs until
     * their edges resolve. */
    while (completed + failed + aborted < TWO_THREAD_REQUESTS || released < failed + aborted) {
        while (registered < TWO_THREAD_REQUESTS &&
               registered - (completed + released) < TWO_THREAD_CAPACITY) {
            uint64_t k = registered;
            request_id(id, sizeof id, k);
            uint64_t key = UINT64_MAX;
            kvdrain_status s = reg(&f, id, k + 1000, 0, agents, 2, 0, &key);
            /* Keys grow with every registration above the request's slot (low 16 bits). */
            if (s != KVDRAIN_OK || key >> 16 != k) anomalies++;
            keys[k] = key;
            registered++;
            atomic_store_explicit(&run.registered, registered, memory_order_release);
        }
        /* Abort each raced request some registrations after its own, while the ingest
         * thread works through the requests in between. */
        while (next_abort < registered &&
               (next_abort + ABORT_LAG <= registered || registered == TWO_THREAD_REQUESTS)) {
            uint64_t k = next_abort++;
            if (!is_raced(k)) continue;
            kvdrain_quarantined q;
            kvdrain_status s = kvdrain_engine_abort(f.engine, keys[k], &q);
            if (s == KVDRAIN_OK) {
                if (q.key != keys[k] || q.cause != KVDRAIN_ABORTED || q.named != 1) anomalies++;
                if (seen[k] & 1) anomalies++;
                seen[k] |= 1 | 4;
                aborted++;
            } else if (s == KVDRAIN_ERR_LATE || s == KVDRAIN_ERR_STALE) {
                /* Decided first: its decision comes, or came, out of poll (STALE: the
                 * engine had taken it from the core already). Checked at the end. */
                seen[k] |= 8;
                late++;
            } else {
                anomalies++;
            }
        }
        size_t n = sizeof d / sizeof d[0];
        OK(kvdrain_engine_poll(f.engine, d, &n));
        if (n == 0) sched_yield();
        for (size_t i = 0; i < n; i++) {
            uint64_t k = d[i].key >> 16;
            if (k >= TWO_THREAD_REQUESTS || keys[k] != d[i].key) {
                anomalies++;
                continue;
            }
            switch (d[i].kind) {
            case KVDRAIN_COMPLETED:
            case KVDRAIN_FAILED:
                if (seen[k] & 1) anomalies++; /* doubled, or decided after an abort */
                seen[k] |= 1;
                if (d[i].kind == KVDRAIN_COMPLETED) {
                    completed++;
                    if (d[i].blocks != k + 1000 || k % 7 == 3) anomalies++;
                } else {
                    failed++;
                    if (k % 7 != 3) anomalies++;
                }
                break;
            case KVDRAIN_RELEASED:
                if (!(seen[k] & 1) || (seen[k] & 2) || d[i].blocks != k + 1000 || d[i].forced)
                    anomalies++;
                seen[k] |= 2;
                released++;
                break;
            default:
                anomalies++;
            }
        }
    }
    pthread_join(t, NULL);
    for (uint64_t k = 0; k < TWO_THREAD_REQUESTS; k++) {
        if (!(seen[k] & 1)) anomalies++;                          /* lost */
        if ((seen[k] & 4) && !(seen[k] & 2)) anomalies++;         /* aborted, never released */
        if (is_raced(k) != !!(seen[k] & (4 | 8))) anomalies++;    /* abort neither won nor lost */
        if ((seen[k] & 4) && (seen[k] & 8)) anomalies++;           /* both */
    }
    CHECK(anomalies == 0);
    CHECK(run.bad == 0);
    CHECK(completed + failed + aborted == TWO_THREAD_REQUESTS);
    CHECK(released == failed + aborted);
    CHECK(aborted + late == (TWO_THREAD_REQUESTS + 5) / 11);
    kvdrain_ingest_counters ic;
    OK(kvdrain_ingest_get_counters(f.ingest, &ic));
    CHECK(ic.last_edges == TWO_THREAD_REQUESTS && ic.ready_overflow == 0);
    CHECK(ic.unknown == TWO_THREAD_REQUESTS);
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    CHECK(info.tracked == 0 && info.live_keys == 0 && info.queued_decisions == 0);
    printf("two threads: %llu requests: %llu completed, %llu failed, %llu aborted (%llu aborts "
           "too late), %llu released\n",
           (unsigned long long)TWO_THREAD_REQUESTS, (unsigned long long)completed,
           (unsigned long long)failed, (unsigned long long)aborted, (unsigned long long)late,
           (unsigned long long)released);
    free(seen);
    free(keys);
    close_ledger(&f);
}

/* The record of each decision, read by key right after the poll that took it: a named
 * request failed by a notice (20) and a gone (30) that settles until 80, each edge with
 * the cause the core wrote; a named request failed by a fence; and an aborted counting
 * request forced back by its quarantine; then hostile keys and pointers. */
static void test_record(void) {
    kvdrain_config cfg;
    OK(kvdrain_config_default(16, &cfg));
    cfg.deadline_ms = 100;
    cfg.quarantine_ms = 1000;
    cfg.settle_ms = 50;
    fixture f = open_with(&cfg);
    const uint16_t agents[3] = {0, 1, 2};
    uint64_t a = 0, c = 0;
    kvdrain_decision d[4];
    kvdrain_record r;
    uint32_t resolved = 0;

    OK(kvdrain_engine_advance(f.engine, 5));
    OK(reg(&f, "a", 10, 0, agents, 3, 0, &a));
    CHECK(feed(&f, 0, "a:3") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_advance(f.engine, 20));
    CHECK(feed(&f, 1, "PUSH_FAIL:a:3") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_advance(f.engine, 30));
    OK(kvdrain_engine_gone(f.engine, 2, &resolved));
    CHECK(resolved == 1);
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_FAILED, a, 0, 0);
    OK(kvdrain_engine_record(f.engine, a, &r));
    CHECK(r.key == a && r.registered_ms == 5 && r.deadline_ms == 105);
    CHECK(r.named_edges == 3 && r.expected == 3 && r.outstanding == 0);
    CHECK(r.edges[0].agent == 0 && r.edges[0].outcome == KVDRAIN_RECORD_EDGE_LANDED);
    CHECK(r.edges[1].agent == 1 && r.edges[1].outcome == KVDRAIN_RECORD_EDGE_FAILURE_NOTICE);
    CHECK(r.edges[2].agent == 2 && r.edges[2].outcome == KVDRAIN_RECORD_EDGE_GONE);
    CHECK(r.failure_notice_ms == 20 && r.gone_ms == 30 && r.fenced_ms == KVDRAIN_NO_TIME);
    CHECK(r.first_failure == KVDRAIN_FAILURE_NOTICE && r.first_failure_ms == 20);
    CHECK(r.ended == KVDRAIN_ENDED_NONE && r.ended_ms == KVDRAIN_NO_TIME);
    CHECK(r.decided_ms == 30 && r.settle_end_ms == 80);
    CHECK(r.released_ms == KVDRAIN_NO_TIME && r.forced == 0);

    OK(kvdrain_engine_advance(f.engine, 80));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, a, 10, 0);
    OK(kvdrain_engine_record(f.engine, a, &r));
    CHECK(r.released_ms == 80 && r.forced == 0 && r.settle_end_ms == 80);

    /* A fence: its edge says so, and the landed one stays landed. */
    const uint16_t fenced_agents[2] = {0, 3};
    uint64_t b = 0;
    OK(reg(&f, "b", 12, 0, fenced_agents, 2, 0, &b));
    CHECK(feed(&f, 0, "b:2") == KVDRAIN_NOTICE_COUNTED);
    OK(kvdrain_engine_fence(f.engine, 3, &resolved));
    CHECK(resolved == 1);
    CHECK(poll_all(&f, d, 4, 4) == 2);
    expect_decision(&d[0], KVDRAIN_FAILED, b, 0, 0);
    expect_decision(&d[1], KVDRAIN_RELEASED, b, 12, 0);
    OK(kvdrain_engine_record(f.engine, b, &r));
    CHECK(r.named_edges == 2 && r.outstanding == 0);
    CHECK(r.edges[0].agent == 0 && r.edges[0].outcome == KVDRAIN_RECORD_EDGE_LANDED);
    CHECK(r.edges[1].agent == 3 && r.edges[1].outcome == KVDRAIN_RECORD_EDGE_FENCED);
    CHECK(r.fenced_ms == 80 && r.gone_ms == KVDRAIN_NO_TIME);
    CHECK(r.failure_notice_ms == KVDRAIN_NO_TIME);
    CHECK(r.first_failure == KVDRAIN_FAILURE_FENCED && r.first_failure_ms == 80);
    CHECK(r.settle_end_ms == KVDRAIN_NO_TIME && r.released_ms == 80 && r.forced == 0);

    OK(reg(&f, "c", 11, 2, NULL, 0, 0, &c));
    kvdrain_quarantined q;
    OK(kvdrain_engine_abort(f.engine, c, &q));
    OK(kvdrain_engine_advance(f.engine, 1080));
    CHECK(poll_all(&f, d, 4, 4) == 1);
    expect_decision(&d[0], KVDRAIN_RELEASED, c, 11, 1);
    OK(kvdrain_engine_record(f.engine, c, &r));
    CHECK(r.named_edges == 0 && r.expected == 2 && r.outstanding == 2 && r.count_failed == 0);
    CHECK(r.ended == KVDRAIN_ENDED_ABORTED && r.ended_ms == 80);
    CHECK(r.first_failure == KVDRAIN_FAILURE_ABORTED && r.first_failure_ms == 80);
    CHECK(r.decided_ms == KVDRAIN_NO_TIME && r.released_ms == 1080 && r.forced == 1);

    /* Hostile input: nothing written, a status back. */
    kvdrain_record untouched;
    memset(&untouched, 0xAB, sizeof untouched);
    r = untouched;
    EXPECT(kvdrain_engine_record(f.engine, a, NULL), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_record(NULL, a, &r), KVDRAIN_ERR_NULL);
    EXPECT(kvdrain_engine_record(f.engine, UINT64_MAX, &r), KVDRAIN_ERR_UNKNOWN);
    EXPECT(kvdrain_engine_record(f.engine, c + ((uint64_t)1 << 16), &r), KVDRAIN_ERR_UNKNOWN);
    /* c took a's slot (its key carries it): a's record is gone, c's is there. */
    CHECK((c & 0xFFFF) == (a & 0xFFFF));
    EXPECT(kvdrain_engine_record(f.engine, a, &r), KVDRAIN_ERR_UNKNOWN);
    CHECK(memcmp(&r, &untouched, sizeof r) == 0);
    OK(kvdrain_engine_record(f.engine, c, &r));
    CHECK(r.key == c && r.expected == 2);
    close_ledger(&f);
}

#define RUN(test)                                                 \
    do {                                                          \
        int before_ = checks_failed;                              \
        test();                                                   \
        if (checks_failed == before_) {                           \
            tests_passed++;                                       \
        } else {                                                  \
            tests_failed++;                                       \
            fprintf(stderr, "FAILED %s\n", #test);                \
        }                                                         \
    } while (0)

/* Two threads calling through one half at once: the call that finds another inside
 * returns KVDRAIN_ERR_BUSY and does nothing; every other call returns OK. */
typedef struct {
    kvdrain_engine *engine;
    atomic_long busy;
    atomic_long other;
    atomic_int stop;
} busy_run;

static void *busy_caller(void *arg) {
    busy_run *run = arg;
    while (!atomic_load(&run->stop)) {
        kvdrain_engine_info info;
        kvdrain_status s = kvdrain_engine_get_info(run->engine, &info);
        if (s == KVDRAIN_ERR_BUSY) {
            atomic_fetch_add(&run->busy, 1);
        } else if (s != KVDRAIN_OK) {
            atomic_fetch_add(&run->other, 1);
        }
    }
    return NULL;
}

static void test_two_threads_on_one_half_get_busy(void) {
    fixture f = open_ledger(8, 1000, 1000);
    busy_run run = {.engine = f.engine};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, busy_caller, &run) == 0);
    /* Until a collision is seen (at once on two cores; on one core when a time slice
     * ends inside a call), at most 2^27 calls. */
    for (long i = 0; i < (1L << 27) && atomic_load(&run.busy) == 0; i++) {
        kvdrain_status s = kvdrain_engine_advance(f.engine, (uint64_t)i);
        if (s == KVDRAIN_ERR_BUSY) {
            atomic_fetch_add(&run.busy, 1);
        } else if (s != KVDRAIN_OK) {
            atomic_fetch_add(&run.other, 1);
        }
    }
    atomic_store(&run.stop, 1);
    pthread_join(t, NULL);
    CHECK(atomic_load(&run.busy) > 0);
    CHECK(atomic_load(&run.other) == 0);
    /* The half is usable again once the other thread is gone. */
    kvdrain_engine_info info;
    OK(kvdrain_engine_get_info(f.engine, &info));
    close_ledger(&f);
}

int main(void) {
    printf("kvdrain %s, C ABI catalogue\n", kvdrain_version());
    RUN(test_c2_failure_then_completion);
    RUN(test_c2_completion_then_failure);
    RUN(test_duplicates_and_unexpected_senders);
    RUN(test_unknown_and_late_ids);
    RUN(test_garbage_changes_nothing_else);
    RUN(test_full_table_and_bad_registrations);
    RUN(test_refused_hold);
    RUN(test_abort);
    RUN(test_deadline);
    RUN(test_fence);
    RUN(test_gone);
    RUN(test_settling);
    RUN(test_settling_from_arrival);
    RUN(test_settling_holds_its_slot);
    RUN(test_settling_counts_from_the_last_notice);
    RUN(test_settling_against_quarantine);
    RUN(test_settle_zero_is_vllm);
    RUN(test_late_poll);
    RUN(test_record);
    RUN(test_batch_feed);
    RUN(test_handles_nulls_and_misuse);
    RUN(test_producer_owed_notices);
    RUN(test_two_threads);
    RUN(test_two_threads_on_one_half_get_busy);
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed == 0 ? 0 : 1;
}
