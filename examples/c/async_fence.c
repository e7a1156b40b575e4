/* An asynchronous FENCE group from C: each iteration's submit launches ONE
 * operation for the whole vector on a "device" (a thread) that signals an
 * eventfd when done; the driver awaits the eventfd through the loop's
 * readiness path without blocking, then collect sets each member's result
 * (xtc_batch(3): B-058, B-063..B-067, B-081, B-082, B-088, B-104).
 *
 * The application owns the eventfd (one for the group, reused by every
 * operation) and keeps it open until the last collect returned; the engine
 * never dups or closes it (B-067). Continuous batching survives the
 * asynchronous boundary: members needing 1, 3 and 2 operations leave the
 * vector independently.
 *
 * Build: cc -std=c11 -Iinclude examples/c/async_fence.c target/release/libxtc_capi.a -lpthread -ldl -lm
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "xtc_batch.h"

struct req {
    const char *name;
    int left;     /* operations still needed (device state) */
    int produced; /* outputs the device wrote for this member */
};

/* The application's device: one operation in flight at a time. */
struct device {
    int fence;             /* eventfd, owned here */
    pthread_t thread;
    struct req *batch[8];  /* the operation's members (copied: the item
                              array lives only for the submit call) */
    size_t count;
    int op;
};

static void *device_run(void *arg) {
    struct device *d = arg;
    for (size_t i = 0; i < d->count; i++) {
        d->batch[i]->left--;
        d->batch[i]->produced++;
    }
    uint64_t one = 1;
    if (write(d->fence, &one, sizeof one) != sizeof one) {
        abort();
    }
    return NULL;
}

static int submit(const xtc_batch_item_t *items, size_t count, void *user,
                  xtc_batch_exec_t *out_exec) {
    struct device *d = user;
    d->op++;
    printf("submit %d: %zu member%s:", d->op, count, count == 1 ? "" : "s");
    d->count = count;
    for (size_t i = 0; i < count; i++) {
        d->batch[i] = items[i].request;
        printf(" %s", d->batch[i]->name);
    }
    printf("\n");
    if (pthread_create(&d->thread, NULL, device_run, d) != 0) {
        return XTC_E_AGAIN; /* fails this iteration's members, no operation outstanding */
    }
    out_exec->kind = XTC_BATCH_EXEC_FENCE;
    out_exec->fence_fd = d->fence;
    return XTC_OK;
}

static int collect(const xtc_batch_item_t *items, xtc_batch_result_t *results, size_t count,
                   int exec_status, void *user) {
    struct device *d = user;
    printf("collect %d: exec_status %s\n", d->op,
           exec_status == XTC_BATCH_EXEC_OK ? "XTC_BATCH_EXEC_OK" : "other");
    if (exec_status != XTC_BATCH_EXEC_OK) {
        return XTC_OK; /* the engine ends the members by the status rules */
    }
    pthread_join(d->thread, NULL);
    uint64_t n;
    if (read(d->fence, &n, sizeof n) != sizeof n) { /* re-arm the fence */
        return XTC_E_INTERNAL;
    }
    for (size_t i = 0; i < count; i++) {
        struct req *r = items[i].request;
        results[i].state = r->left == 0 ? XTC_BATCH_DONE : XTC_BATCH_CONTINUE;
    }
    return XTC_OK;
}

static void complete(uint64_t handle, void *request, int outcome, void *user) {
    (void)handle;
    (void)user;
    struct req *r = request;
    printf("complete %s: %s after %d outputs\n", r->name,
           outcome == XTC_OK ? "XTC_OK" : "error", r->produced);
}

static void check(const char *what, int rc) {
    if (rc != XTC_OK) {
        printf("%s failed: %d\n", what, rc);
        exit(1);
    }
}

int main(void) {
    struct device dev = {.fence = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    if (dev.fence < 0) {
        perror("eventfd");
        return 1;
    }
    xtc_loop_t *loop = NULL;
    check("xtc_loop_new", xtc_loop_new(&loop));
    xtc_batch_async_opts_t opts = {
        .size = sizeof opts,
        .version = XTC_BATCH_VERSION,
        .capacity = 3,
        .max_active = 3,
        .resource_capacity = 3,
        .exec_timeout_ns = 0, /* no engine timeout */
        .submit = submit,
        .collect = collect,
        .complete = complete,
        .user = &dev,
    };
    xtc_batch_t *group = NULL;
    check("xtc_batch_create_async", xtc_batch_create_async(loop, &opts, &group));

    struct req reqs[] = {{"a", 1, 0}, {"b", 3, 0}, {"c", 2, 0}};
    for (int i = 0; i < 3; i++) {
        uint64_t h;
        check("xtc_batch_submit", xtc_batch_submit(group, &reqs[i], 1, &h));
    }
    check("xtc_batch_close", xtc_batch_close(group, XTC_BATCH_DRAIN));
    check("xtc_loop_run", xtc_loop_run(loop));

    xtc_batch_stats_t st = {.size = sizeof st, .version = XTC_BATCH_VERSION};
    xtc_batch_async_stats_t ast = {.size = sizeof ast, .version = XTC_BATCH_VERSION};
    check("xtc_batch_get_stats", xtc_batch_get_stats(group, &st));
    check("xtc_batch_get_async_stats", xtc_batch_get_async_stats(group, &ast));
    printf("stats: iterations=%" PRIu64 " completed=%" PRIu64 " total_members=%" PRIu64 "\n",
           st.iterations, st.completed, st.total_members);
    printf("async stats: offloads=%" PRIu64 " offload_timeouts=%" PRIu64
           " offload_errors=%" PRIu64 "\n",
           ast.offloads, ast.offload_timeouts, ast.offload_errors);

    check("xtc_batch_destroy", xtc_batch_destroy(group));
    check("xtc_loop_fini", xtc_loop_fini(loop));
    /* The fence stayed the application's: still open, closed here. */
    printf("fence fd still open after destroy: %s\n", fcntl(dev.fence, F_GETFD) != -1 ? "yes" : "no");
    close(dev.fence);
    printf("done\n");
    return 0;
}
