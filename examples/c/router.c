/* The keyed-shard router over two loops of an executor, with placement
 * (xtc_batch(3): B-156..B-171, B-149).
 *
 * - xtc_exec_new starts two carrier threads, each with a loop.
 * - xtc_accel_probe_in lists the devices of a fixture sysfs tree (argv[1]);
 *   xtc_batch_loop_for_device names the loop on the device's NUMA node (loop
 *   0 on a single-node host: absence of topology is not an error, B-163).
 * - xtc_exec_setup runs code on each carrier before the first run: one
 *   synchronous group per loop. The router copies the two group pointers;
 *   xtc_batch_route(key) is groups[key % 2]. The caller submits to the group
 *   the router returns, on that group's loop (a second setup round); the
 *   router never submits (B-170).
 * - xtc_exec_run runs both loops until their drivers drain, then joins the
 *   carriers; destroy and statistics are then allowed from this thread
 *   (externally synchronized quiescent calls after executor return, B-149).
 *
 * Build: cc -std=c11 -Iinclude examples/c/router.c target/release/libxtc_capi.a -lpthread -ldl -lm
 * Run:   ./router devices/nvidia-2node
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "xtc_batch.h"

#define SHARDS 2
#define KEYS 10

struct req {
    uint64_t key;
    int shard;      /* the shard whose step ran it */
    int iterations; /* steps it took part in */
    int outcome;
};

struct shard {
    int idx;
    xtc_batch_t *group;
    int steps;
};

static struct req reqs[KEYS];
static struct shard shards[SHARDS];
static xtc_batch_router_t *router;

static int step(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                void *user) {
    struct shard *s = user;
    s->steps++;
    for (size_t i = 0; i < count; i++) {
        struct req *r = items[i].request;
        r->shard = s->idx;
        r->iterations++;
        /* key k needs k % 3 + 1 iterations */
        results[i].state = r->iterations == (int)(r->key % 3) + 1 ? XTC_BATCH_DONE
                                                                  : XTC_BATCH_CONTINUE;
    }
    return XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    ((struct req *)request)->outcome = outcome;
}

static void check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %d\n", what, rc);
        exit(1);
    }
}

/* On carrier `s->idx`, before the first run: the shard's group. */
static void create_group(xtc_loop_t *loop, void *arg) {
    struct shard *s = arg;
    xtc_batch_opts_t opts = {
        .size = sizeof opts,
        .version = XTC_BATCH_VERSION,
        .capacity = KEYS,
        .max_active = 4,
        .resource_capacity = 4,
        .step = step,
        .complete = complete,
        .user = s,
    };
    check("xtc_batch_create", xtc_batch_create(loop, &opts, &s->group));
}

/* On carrier `s->idx`: submit the keys the router sends here, then close. */
static void submit_routed(xtc_loop_t *loop, void *arg) {
    (void)loop;
    struct shard *s = arg;
    for (uint64_t k = 0; k < KEYS; k++) {
        if (xtc_batch_route(router, k) == s->group) {
            uint64_t h;
            reqs[k].key = k;
            check("xtc_batch_submit", xtc_batch_submit(s->group, &reqs[k], 1, &h));
        }
    }
    check("xtc_batch_close", xtc_batch_close(s->group, XTC_BATCH_DRAIN));
}

static const char *name(int rc) {
    switch (rc) {
    case XTC_OK: return "XTC_OK";
    case XTC_E_INVAL: return "XTC_E_INVAL";
    case XTC_E_NOSYS: return "XTC_E_NOSYS";
    default: return "other";
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SYSFS_FIXTURE_ROOT\n", argv[0]);
        return 2;
    }
    xtc_exec_t *exec = NULL;
    check("xtc_exec_new", xtc_exec_new(SHARDS, &exec));
    int n_loops = xtc_exec_n_loops(exec);
    printf("executor: %d loops\n", n_loops);

    xtc_accel_dev_t devs[4];
    size_t n_devs = 0;
    check("xtc_accel_probe_in", xtc_accel_probe_in(argv[1], devs, 4, &n_devs));
    for (size_t i = 0; i < n_devs && i < 4; i++) {
        int idx = -1;
        check("xtc_batch_loop_for_device", xtc_batch_loop_for_device(exec, &devs[i], &idx));
        printf("device %s (driver %s, NUMA node %d): loop index in [0, %d): %s\n", devs[i].name,
               devs[i].driver, devs[i].numa_node, n_loops,
               idx >= 0 && idx < n_loops ? "yes" : "no");
    }
    printf("loop_for_device(NULL device): %s\n",
           name(xtc_batch_loop_for_device(exec, NULL, &(int){0})));

    for (int i = 0; i < SHARDS; i++) {
        shards[i].idx = i;
        check("xtc_exec_setup", xtc_exec_setup(exec, i, create_group, &shards[i]));
    }
    xtc_batch_t *groups[SHARDS] = {shards[0].group, shards[1].group};
    printf("router over 0 groups: %s, over a NULL group: %s\n",
           name(xtc_batch_router_create(groups, 0, &router)),
           name(xtc_batch_router_create((xtc_batch_t *[]){groups[0], NULL}, 2, &router)));
    check("xtc_batch_router_create", xtc_batch_router_create(groups, SHARDS, &router));
    printf("route(NULL router) is NULL: %s; route(42) is stable: %s\n",
           xtc_batch_route(NULL, 42) == NULL ? "yes" : "no",
           xtc_batch_route(router, 42) == xtc_batch_route(router, 42) ? "yes" : "no");
    uint64_t h;
    printf("submit from the main thread to a carrier's group: %s\n",
           name(xtc_batch_submit(shards[0].group, &reqs[0], 1, &h)));

    for (int i = 0; i < SHARDS; i++) {
        check("xtc_exec_setup", xtc_exec_setup(exec, i, submit_routed, &shards[i]));
    }
    check("xtc_exec_run", xtc_exec_run(exec));

    for (int k = 0; k < KEYS; k++) {
        printf("key %d -> shard %d: %s after %d iteration%s\n", k, reqs[k].shard,
               name(reqs[k].outcome), reqs[k].iterations, reqs[k].iterations == 1 ? "" : "s");
    }
    for (int i = 0; i < SHARDS; i++) {
        xtc_batch_stats_t st = {.size = sizeof st, .version = XTC_BATCH_VERSION};
        check("xtc_batch_get_stats", xtc_batch_get_stats(shards[i].group, &st));
        printf("shard %d: completed=%" PRIu64 " iterations=%" PRIu64 " (steps seen %d)\n", i,
               st.completed, st.iterations, shards[i].steps);
        check("xtc_batch_destroy", xtc_batch_destroy(shards[i].group));
    }
    xtc_batch_router_destroy(router);
    check("xtc_exec_fini", xtc_exec_fini(exec));
    printf("done\n");
    return 0;
}
