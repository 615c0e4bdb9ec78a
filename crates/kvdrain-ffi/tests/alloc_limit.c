/* kvdrain_ledger_new under an address-space limit: KVDRAIN_ERR_ALLOC, never an abort.
 *
 * Each try runs in a child process (fork) that limits its address space (RLIMIT_AS) to
 * what it uses now plus a headroom, then builds a ledger. A ledger needs 13.8 MiB of
 * tables, a key table for its capacity and, while it is built, a thread with a ~71 MiB
 * stack, so small headrooms fail at the tables, middle ones at the thread, large ones
 * succeed. Every child must exit normally with OK or ALLOC; a signal (SIGABRT from an
 * allocation failure) fails the test. Built without sanitizers: AddressSanitizer reserves
 * terabytes of address space and cannot run under RLIMIT_AS. */
#include "kvdrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

enum { BUILT = 10, ALLOC = 11, OTHER = 12, NO_LIMIT = 13 };

static long long vm_size_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = -1;
    if (f == NULL) return -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "VmSize:", 7) == 0) kib = atoll(line + 7);
    }
    fclose(f);
    return kib < 0 ? -1 : kib * 1024;
}

static int try_under_limit(long long headroom_mib) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        long long vm = vm_size_bytes();
        struct rlimit limit;
        if (vm < 0 || getrlimit(RLIMIT_AS, &limit) != 0) _exit(NO_LIMIT);
        limit.rlim_cur = (rlim_t)(vm + (headroom_mib << 20));
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(NO_LIMIT);
        kvdrain_config cfg;
        if (kvdrain_config_default(KVDRAIN_MAX_CAPACITY, &cfg) != KVDRAIN_OK) _exit(OTHER);
        kvdrain_ledger *ledger = (kvdrain_ledger *)0x1; /* must stay untouched on failure */
        kvdrain_status s = kvdrain_ledger_new(&cfg, &ledger);
        if (s == KVDRAIN_OK) {
            kvdrain_ledger_free(ledger);
            _exit(BUILT);
        }
        _exit(s == KVDRAIN_ERR_ALLOC && ledger == (kvdrain_ledger *)0x1 ? ALLOC : OTHER);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "headroom %lld MiB: killed by signal %d\n", headroom_mib,
                WTERMSIG(status));
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void) {
    static const long long headrooms[] = {4, 16, 40, 64, 72, 80, 96, 192, 256};
    int built = 0, alloc = 0, failed = 0;
    for (size_t i = 0; i < sizeof headrooms / sizeof headrooms[0]; i++) {
        int r = try_under_limit(headrooms[i]);
        printf("headroom %3lld MiB: %s\n", headrooms[i],
               r == BUILT ? "built" : r == ALLOC ? "KVDRAIN_ERR_ALLOC" : "FAILED");
        built += r == BUILT;
        alloc += r == ALLOC;
        failed += r != BUILT && r != ALLOC;
    }
    if (failed || alloc == 0 || built == 0 || try_under_limit(4) != ALLOC ||
        try_under_limit(256) != BUILT) {
        fprintf(stderr, "alloc_limit: FAILED (%d built, %d ALLOC, %d other)\n", built, alloc,
                failed);
        return 1;
    }
    printf("alloc_limit: %d built, %d KVDRAIN_ERR_ALLOC, no abort\n", built, alloc);
    return 0;
}
