/* Adversarial runs of the C ABI, meant for AddressSanitizer and UBSan, bounded in time
 * (argv[1] seconds in all, default 20):
 *
 * 1. free orders: all six orders of freeing a ledger's three handles, over and over,
 *    while one thread calls through the ingest half, one through the engine half and a
 *    third intrudes on the engine half from the side. Every call returns a status its
 *    situation allows (OK, FREED once a handle or the ledger is freed, BUSY for the
 *    intruder or a call it collides with); nothing reads freed memory.
 * 2. garbage: one ledger fed random bytes, valid and stale completions, failure notices
 *    and batches (with NULL and oversized spans) from an ingest thread, while an engine
 *    thread registers, aborts, fences, advances and polls at random and a third thread
 *    reads both halves' counters (BUSY collisions included). Each key's decisions must
 *    form a legal sequence: COMPLETED alone, or (FAILED | EXPIRED | abort) then one
 *    RELEASED, with the blocks given at registration. */
#define _POSIX_C_SOURCE 200809L
#include "kvdrain.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int failures = 0;

#define FAIL(...)                                   \
    do {                                            \
        if (atomic_fetch_add(&failures, 1) < 20) {  \
            fprintf(stderr, "hammer: " __VA_ARGS__); \
            fputc('\n', stderr);                    \
        }                                           \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static size_t message(uint64_t *rng, char *buf, size_t cap) {
    unsigned id = (unsigned)(next(rng) % 512);
    switch (next(rng) % 6) {
    case 0: return (size_t)snprintf(buf, cap, "h-%u:%u", id, (unsigned)(next(rng) % 3 + 1));
    case 1: return (size_t)snprintf(buf, cap, "PUSH_FAIL:h-%u:2", id);
    case 2: return (size_t)snprintf(buf, cap, "HB:h-%u", id);
    case 3: return (size_t)snprintf(buf, cap, "h-%u:0", id);
    default: {
        size_t n = (size_t)(next(rng) % cap);
        for (size_t i = 0; i < n; i++) buf[i] = (char)next(rng);
        return n;
    }
    }
}

/* ---- 1. free orders ------------------------------------------------------------- */

typedef struct {
    kvdrain_ledger *ledger;
    kvdrain_ingest *ingest;
    kvdrain_engine *engine;
    uint64_t seed;
    atomic_long busy_seen;
} group;

static void *feed_until_freed(void *arg) {
    group *g = arg;
    uint64_t rng = g->seed;
    char buf[48];
    for (;;) {
        size_t n = message(&rng, buf, sizeof buf);
        kvdrain_notice outcome;
        kvdrain_status s = kvdrain_ingest_feed(g->ingest, (uint16_t)(next(&rng) % 4),
                                               (const uint8_t *)buf, n, &outcome);
        if (s == KVDRAIN_ERR_FREED) return NULL;
        if (s != KVDRAIN_OK) FAIL("ingest feed returned %u", (unsigned)s);
    }
}

static void *drive_until_freed(void *arg) {
    group *g = arg;
    uint64_t rng = g->seed ^ 0x55;
    uint64_t clock = 0;
    char id[24];
    for (;;) {
        kvdrain_status s;
        switch (next(&rng) % 4) {
        case 0: {
            int n = snprintf(id, sizeof id, "h-%u", (unsigned)(next(&rng) % 512));
            kvdrain_registration r = {(const uint8_t *)id, (size_t)n, 1, 2, NULL, 0, 0};
            s = kvdrain_engine_register(g->engine, &r, NULL);
            if (s == KVDRAIN_ERR_FULL || s == KVDRAIN_ERR_DUPLICATE_ID) s = KVDRAIN_OK;
            break;
        }
        case 1: {
            kvdrain_decision out[8];
            size_t room = 8;
            s = kvdrain_engine_poll(g->engine, out, &room);
            break;
        }
        case 2:
            clock += next(&rng) % 50;
            s = kvdrain_engine_advance(g->engine, clock);
            break;
        default:
            s = kvdrain_engine_abort(g->engine, next(&rng) % 64, NULL);
            if (s == KVDRAIN_ERR_UNKNOWN || s == KVDRAIN_ERR_LATE || s == KVDRAIN_ERR_STALE)
                s = KVDRAIN_OK;
            break;
        }
        if (s == KVDRAIN_ERR_FREED) return NULL;
        /* The intruder may be inside the engine half right now. */
        if (s == KVDRAIN_ERR_BUSY) {
            atomic_fetch_add(&g->busy_seen, 1);
            continue;
        }
        if (s != KVDRAIN_OK) FAIL("engine call returned %u", (unsigned)s);
    }
}

static void *intrude_until_freed(void *arg) {
    group *g = arg;
    for (;;) {
        kvdrain_engine_info info;
        kvdrain_status s = kvdrain_engine_get_info(g->engine, &info);
        if (s == KVDRAIN_ERR_FREED) return NULL;
        if (s == KVDRAIN_ERR_BUSY) {
            atomic_fetch_add(&g->busy_seen, 1);
        } else if (s != KVDRAIN_OK) {
            FAIL("intruding get_info returned %u", (unsigned)s);
        }
        struct timespec t = {0, 2000};
        nanosleep(&t, NULL);
    }
}

static void pause_a_little(uint64_t *rng) {
    struct timespec t = {0, (long)(next(rng) % 300000)};
    nanosleep(&t, NULL);
}

static void free_handle(group *g, int which) {
    if (which == 0) kvdrain_ledger_free(g->ledger);
    if (which == 1) kvdrain_ingest_free(g->ingest);
    if (which == 2) kvdrain_engine_free(g->engine);
}

static long free_orders(double seconds) {
    static const int orders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                     {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    uint64_t rng = 42;
    long rounds = 0, busy = 0;
    double end = now_s() + seconds;
    kvdrain_config cfg;
    kvdrain_config_default(64, &cfg);
    while (now_s() < end || rounds < 6) {
        const int *order = orders[rounds % 6];
        group g = {0};
        g.seed = next(&rng);
        if (kvdrain_ledger_new(&cfg, &g.ledger) != KVDRAIN_OK ||
            kvdrain_ledger_split(g.ledger, &g.ingest, &g.engine) != KVDRAIN_OK) {
            FAIL("cannot open a ledger");
            return rounds;
        }
        pthread_t t[3];
        pthread_create(&t[0], NULL, feed_until_freed, &g);
        pthread_create(&t[1], NULL, drive_until_freed, &g);
        pthread_create(&t[2], NULL, intrude_until_freed, &g);
        pause_a_little(&rng);
        free_handle(&g, order[0]);
        /* A second free of the same handle does nothing while the group lives. */
        free_handle(&g, order[0]);
        pause_a_little(&rng);
        free_handle(&g, order[1]);
        /* The first two frees include the ledger or both halves: every thread now gets
         * FREED and stops; only then may the last handle (and the memory) go. */
        for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
        free_handle(&g, order[2]);
        busy += atomic_load(&g.busy_seen);
        rounds++;
    }
    printf("free orders: %ld rounds (all six orders), %ld BUSY collisions\n", rounds, busy);
    return rounds;
}

/* ---- 2. garbage ----------------------------------------------------------------- */

enum { MAX_KEYS = 1 << 20 };
enum { PENDING = 1, QUARANTINED = 2, DONE = 3 };

typedef struct {
    kvdrain_ledger *ledger;
    kvdrain_ingest *ingest;
    kvdrain_engine *engine;
    double end;
    atomic_int stop;
    atomic_long busy_seen;
    long decisions, fed;
    unsigned char *state; /* per registration number */
    uint64_t *blocks;     /* per registration number */
    uint64_t *keys;       /* per registration number */
} arena;

/* A key's registration number: keys carry their request's slot in their low 16 bits and
 * grow with every registration above them. */
static uint64_t number(uint64_t key) { return key >> 16; }

static void *garbage_feeder(void *arg) {
    arena *a = arg;
    uint64_t rng = 7;
    char bufs[16][48];
    const uint8_t *msgs[16];
    size_t lens[16];
    uint16_t agents[16];
    kvdrain_notice outcomes[16];
    while (!atomic_load(&a->stop)) {
        kvdrain_status s;
        if (next(&rng) % 4 == 0) {
            size_t n = (size_t)(next(&rng) % 17);
            for (size_t i = 0; i < n; i++) {
                lens[i] = message(&rng, bufs[i], sizeof bufs[i]);
                msgs[i] = (const uint8_t *)bufs[i];
                agents[i] = (uint16_t)(next(&rng) % 5);
            }
            if (n > 0 && next(&rng) % 8 == 0) {
                msgs[n - 1] = NULL; /* a NULL span with a length: refused, nothing fed */
                lens[n - 1] = 3;
            }
            size_t decided = 0;
            s = kvdrain_ingest_feed_batch(a->ingest, n, agents, msgs, lens, outcomes, &decided);
            if (s == KVDRAIN_ERR_NULL && n > 0 && msgs[n - 1] == NULL) s = KVDRAIN_OK;
            if (s == KVDRAIN_OK) a->fed += (long)n;
        } else {
            size_t n = message(&rng, bufs[0], sizeof bufs[0]);
            s = kvdrain_ingest_feed(a->ingest, (uint16_t)(next(&rng) % 5),
                                    (const uint8_t *)bufs[0], n, NULL);
            a->fed += s == KVDRAIN_OK;
        }
        if (s == KVDRAIN_ERR_BUSY) {
            atomic_fetch_add(&a->busy_seen, 1);
        } else if (s != KVDRAIN_OK) {
            FAIL("garbage feed returned %u", (unsigned)s);
        }
    }
    return NULL;
}

static void *counter_reader(void *arg) {
    arena *a = arg;
    while (!atomic_load(&a->stop)) {
        kvdrain_ingest_counters ic;
        kvdrain_engine_counters ec;
        kvdrain_status s1 = kvdrain_ingest_get_counters(a->ingest, &ic);
        kvdrain_status s2 = kvdrain_engine_get_counters(a->engine, &ec);
        if (s1 == KVDRAIN_ERR_BUSY || s2 == KVDRAIN_ERR_BUSY) atomic_fetch_add(&a->busy_seen, 1);
        if ((s1 != KVDRAIN_OK && s1 != KVDRAIN_ERR_BUSY) ||
            (s2 != KVDRAIN_OK && s2 != KVDRAIN_ERR_BUSY))
            FAIL("counters returned %u / %u", (unsigned)s1, (unsigned)s2);
        struct timespec t = {0, 2000};
        nanosleep(&t, NULL);
    }
    return NULL;
}

static void check_decision(arena *a, const kvdrain_decision *d) {
    a->decisions++;
    uint64_t n = number(d->key);
    if (n >= MAX_KEYS || a->state[n] == 0 || a->keys[n] != d->key) {
        FAIL("decision for key %llu never handed out", (unsigned long long)d->key);
        return;
    }
    unsigned char *st = &a->state[n];
    switch (d->kind) {
    case KVDRAIN_COMPLETED:
        if (*st != PENDING || d->blocks != a->blocks[n])
            FAIL("COMPLETED for key %llu in state %d", (unsigned long long)d->key, *st);
        *st = DONE;
        break;
    case KVDRAIN_FAILED:
    case KVDRAIN_EXPIRED:
        if (*st != PENDING)
            FAIL("kind %u for key %llu in state %d", (unsigned)d->kind,
                 (unsigned long long)d->key, *st);
        *st = QUARANTINED;
        break;
    case KVDRAIN_RELEASED:
        if (*st != QUARANTINED || d->blocks != a->blocks[n])
            FAIL("RELEASED for key %llu in state %d", (unsigned long long)d->key, *st);
        *st = DONE;
        break;
    default:
        FAIL("unknown decision kind %u", (unsigned)d->kind);
    }
}

/* Retries a call the counter reader collided with. */
#define RETRY_BUSY(a, s, call)                                          \
    do {                                                                \
        (s) = (call);                                                   \
        if ((s) == KVDRAIN_ERR_BUSY) atomic_fetch_add(&(a)->busy_seen, 1); \
    } while ((s) == KVDRAIN_ERR_BUSY)

static void garbage_engine(arena *a) {
    uint64_t rng = 99, clock = 0, registered = 0, next_key_hint = 0;
    char id[24];
    /* Until the time is up, or the arena's registration numbers are (a fast host hands
     * out MAX_KEYS keys before the time is up). */
    while (now_s() < a->end && next_key_hint < MAX_KEYS) {
        kvdrain_status s;
        uint64_t pick = next(&rng) % 16;
        if (pick < 6) {
            int n = snprintf(id, sizeof id, "h-%u", (unsigned)(next(&rng) % 512));
            uint16_t agents[4] = {0, 1, 2, 3};
            int named = next(&rng) % 2;
            size_t n_agents = named ? (size_t)(next(&rng) % 5) : 0;
            uint32_t count = named ? 0 : (uint32_t)(next(&rng) % 4);
            uint64_t blocks = 1000 + registered;
            kvdrain_registration r = {(const uint8_t *)id, (size_t)n, blocks, count,
                                      n_agents ? agents : NULL, n_agents,
                                      next(&rng) % 3 ? 0 : next(&rng) % 200 + 1};
            uint64_t key = UINT64_MAX;
            RETRY_BUSY(a, s, kvdrain_engine_register(a->engine, &r, &key));
            if (s == KVDRAIN_OK) {
                uint64_t n = number(key);
                if (n >= MAX_KEYS || a->state[n] != 0) {
                    FAIL("key %llu handed out twice or too high", (unsigned long long)key);
                    return;
                }
                a->state[n] = PENDING;
                a->blocks[n] = blocks;
                a->keys[n] = key;
                registered++;
                next_key_hint = n + 1;
            } else if (s != KVDRAIN_ERR_FULL && s != KVDRAIN_ERR_DUPLICATE_ID &&
                       s != KVDRAIN_ERR_BAD_COUNT && s != KVDRAIN_ERR_BAD_EDGES) {
                FAIL("register returned %u", (unsigned)s);
            }
        } else if (pick < 9) {
            kvdrain_decision out[8];
            size_t room = (size_t)(next(&rng) % 9);
            RETRY_BUSY(a, s, kvdrain_engine_poll(a->engine, room ? out : NULL, &room));
            if (s != KVDRAIN_OK) FAIL("poll returned %u", (unsigned)s);
            for (size_t i = 0; s == KVDRAIN_OK && i < room; i++) check_decision(a, &out[i]);
        } else if (pick < 12) {
            clock += next(&rng) % 40;
            RETRY_BUSY(a, s, kvdrain_engine_advance(a->engine, clock));
            if (s != KVDRAIN_OK) FAIL("advance returned %u", (unsigned)s);
            if (next(&rng) % 64 == 0) {
                RETRY_BUSY(a, s, kvdrain_engine_advance(a->engine, clock / 2));
                if (s != KVDRAIN_ERR_CLOCK_BACKWARDS && !(s == KVDRAIN_OK && clock / 2 == clock))
                    FAIL("backwards advance returned %u", (unsigned)s);
            }
        } else if (pick < 14) {
            /* A key handed out, or one never issued (above them), or any number. */
            uint64_t n = next_key_hint ? next(&rng) % (next_key_hint + 4) : next(&rng) % 4;
            uint64_t key = n < MAX_KEYS && a->state[n] ? a->keys[n] : n << 16;
            if (next(&rng) % 8 == 0) key = next(&rng);
            kvdrain_quarantined q;
            RETRY_BUSY(a, s, kvdrain_engine_abort(a->engine, key, &q));
            if (s == KVDRAIN_OK) {
                n = number(key);
                if (n >= MAX_KEYS || a->keys[n] != key || a->state[n] != PENDING)
                    FAIL("abort of key %llu in state %d", (unsigned long long)key,
                         n < MAX_KEYS ? a->state[n] : -1);
                else
                    a->state[n] = QUARANTINED;
            } else if (s != KVDRAIN_ERR_UNKNOWN && s != KVDRAIN_ERR_LATE &&
                       s != KVDRAIN_ERR_STALE) {
                FAIL("abort returned %u", (unsigned)s);
            }
        } else if (pick < 15 && next(&rng) % 2) {
            /* The record of any key: a known one's, or an error; never a crash. */
            uint64_t n = next_key_hint ? next(&rng) % (next_key_hint + 4) : 0;
            uint64_t key = n < MAX_KEYS && a->state[n] ? a->keys[n] : next(&rng);
            kvdrain_record rec;
            RETRY_BUSY(a, s, kvdrain_engine_record(a->engine, key, &rec));
            if (s == KVDRAIN_OK && rec.key != key) FAIL("record of key %llu names another",
                                                       (unsigned long long)key);
            else if (s != KVDRAIN_OK && s != KVDRAIN_ERR_UNKNOWN)
                FAIL("record returned %u", (unsigned)s);
        } else if (pick < 15) {
            uint32_t resolved;
            RETRY_BUSY(a, s, kvdrain_engine_fence(a->engine, (uint16_t)(next(&rng) % 5),
                                                  &resolved));
            if (s != KVDRAIN_OK) FAIL("fence returned %u", (unsigned)s);
        } else {
            /* Misuse: NULLs and a span with a NULL pointer. */
            kvdrain_registration r = {NULL, 5, 0, 1, NULL, 0, 0};
            RETRY_BUSY(a, s, kvdrain_engine_register(a->engine, &r, NULL));
            if (s != KVDRAIN_ERR_NULL) FAIL("NULL id returned %u", (unsigned)s);
            RETRY_BUSY(a, s, kvdrain_engine_poll(a->engine, NULL, NULL));
            if (s != KVDRAIN_ERR_NULL) FAIL("poll(NULL) returned %u", (unsigned)s);
        }
    }
}

static int garbage(double seconds) {
    arena a = {0};
    a.state = calloc(MAX_KEYS, 1);
    a.blocks = calloc(MAX_KEYS, sizeof *a.blocks);
    a.keys = calloc(MAX_KEYS, sizeof *a.keys);
    kvdrain_config cfg;
    kvdrain_config_default(256, &cfg);
    cfg.deadline_ms = 300;
    cfg.quarantine_ms = 500;
    cfg.settle_ms = 20;
    if (a.state == NULL || a.blocks == NULL || a.keys == NULL || kvdrain_ledger_new(&cfg, &a.ledger) != KVDRAIN_OK ||
        kvdrain_ledger_split(a.ledger, &a.ingest, &a.engine) != KVDRAIN_OK) {
        FAIL("cannot open the garbage ledger");
        return 1;
    }
    a.end = now_s() + seconds;
    pthread_t feeder, reader;
    pthread_create(&feeder, NULL, garbage_feeder, &a);
    pthread_create(&reader, NULL, counter_reader, &a);
    garbage_engine(&a);
    atomic_store(&a.stop, 1);
    pthread_join(feeder, NULL);
    pthread_join(reader, NULL);
    printf("garbage: %ld notifications fed, %ld decisions checked, %ld BUSY collisions%s\n",
           a.fed, a.decisions, atomic_load(&a.busy_seen),
           now_s() < a.end ? " (stopped at the arena's registration numbers)" : "");
    kvdrain_ingest_free(a.ingest);
    kvdrain_engine_free(a.engine);
    kvdrain_ledger_free(a.ledger);
    free(a.state);
    free(a.blocks);
    free(a.keys);
    return 0;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 20.0;
    double t0 = now_s();
    free_orders(seconds / 2);
    garbage(seconds / 2);
    int failed = atomic_load(&failures);
    printf("hammer: %.1f s, %s\n", now_s() - t0, failed ? "FAILED" : "ok");
    return failed ? 1 : 0;
}
