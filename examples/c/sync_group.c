/* A synchronous group from C: the step gets ONE vector of ready members per
 * iteration, members finish independently, waiting members refill at the
 * next boundary (xtc_batch(3): B-002, B-003, B-032..B-034, B-039).
 *
 * Four requests that need 1, 3, 2 and 1 iterations go into a group of
 * capacity 4 whose active set holds 2 (max_active) and 2 resource units;
 * request "d" is charged 2 units, so it waits until it is alone (strict FCFS,
 * B-021). Requests are submitted and the group closed (DRAIN) before the
 * loop's first run; xtc_loop_run returns when the driver has drained it.
 *
 * Build: cc -std=c11 -Iinclude examples/c/sync_group.c target/release/libxtc_capi.a -lpthread -ldl -lm
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "xtc_batch.h"

struct req {
    const char *name;
    int left; /* iterations still needed */
};

static int step(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                void *user) {
    int *iteration = user;
    ++*iteration;
    printf("step %d: %zu member%s:", *iteration, count, count == 1 ? "" : "s");
    for (size_t i = 0; i < count; i++) {
        struct req *r = items[i].request;
        printf(" %s", r->name);
        if (results[i].state != XTC_BATCH_UNSET) {
            printf(" (result word not UNSET on entry!)");
        }
        r->left--;
        results[i].state = r->left == 0 ? XTC_BATCH_DONE : XTC_BATCH_CONTINUE;
    }
    printf("\n");
    return XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    struct req *r = request;
    printf("complete %s: %s\n", r->name, outcome == XTC_OK ? "XTC_OK" : "error");
}

static int check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %d\n", what, rc);
        exit(1);
    }
    return rc;
}

int main(void) {
    xtc_loop_t *loop = NULL;
    check("xtc_loop_new", xtc_loop_new(&loop));

    int iteration = 0;
    xtc_batch_opts_t opts = {
        .size = sizeof opts,
        .version = XTC_BATCH_VERSION,
        .capacity = 4,
        .max_active = 2,
        .resource_capacity = 2,
        .sched_class = NULL,
        .step = step,
        .complete = complete,
        .user = &iteration,
    };
    xtc_batch_t *group = NULL;
    check("xtc_batch_create", xtc_batch_create(loop, &opts, &group));

    struct req reqs[] = {{"a", 1}, {"b", 3}, {"c", 2}, {"d", 1}};
    const uint64_t charges[] = {1, 1, 1, 2};
    uint64_t handles[4] = {0};
    for (int i = 0; i < 4; i++) {
        check("xtc_batch_submit", xtc_batch_submit(group, &reqs[i], charges[i], &handles[i]));
    }
    int monotonic = handles[0] != 0 && handles[0] < handles[1] && handles[1] < handles[2] &&
                    handles[2] < handles[3];
    printf("handles nonzero and increasing: %s\n", monotonic ? "yes" : "no");

    uint64_t unchanged = 77;
    printf("fifth submit into a full group: %s, handle unchanged: %s\n",
           xtc_batch_submit(group, NULL, 1, &unchanged) == XTC_E_AGAIN ? "XTC_E_AGAIN" : "?",
           unchanged == 77 ? "yes" : "no");

    check("xtc_batch_close", xtc_batch_close(group, XTC_BATCH_DRAIN));
    printf("destroy before the driver ran: %s\n",
           xtc_batch_destroy(group) == XTC_E_AGAIN ? "XTC_E_AGAIN" : "?");
    check("xtc_loop_run", xtc_loop_run(loop));

    xtc_batch_stats_t st = {.size = sizeof st, .version = XTC_BATCH_VERSION};
    check("xtc_batch_get_stats", xtc_batch_get_stats(group, &st));
    printf("stats: iterations=%" PRIu64 " completed=%" PRIu64 " max_vector=%" PRIu64
           " total_members=%" PRIu64 " rejections=%" PRIu64 " queued=%" PRIu64 "\n",
           st.iterations, st.completed, st.max_vector, st.total_members, st.rejections,
           st.queued);
    xtc_batch_async_stats_t ast = {.size = sizeof ast, .version = XTC_BATCH_VERSION};
    check("xtc_batch_get_async_stats", xtc_batch_get_async_stats(group, &ast));
    printf("async stats of a synchronous group: offloads=%" PRIu64 " mt_queued=%" PRIu64 "\n",
           ast.offloads, ast.mt_queued);
    check("xtc_batch_destroy", xtc_batch_destroy(group));
    check("xtc_loop_fini", xtc_loop_fini(loop));
    printf("done\n");
    return 0;
}
