/*
 * upnvme's "hello world" in C (the same job as driver/examples/hello_world.rs):
 * open the controller, write a string to the first block of namespace 1 from a
 * completion callback chain (write, then read from inside the write's callback),
 * read it back, print it.
 *
 *   cc -o hello_world_c hello_world.c $(pkg-config --cflags --libs upnvme)
 *   ./hello_world_c [0000:00:04.0]
 *
 * (inside the test bed: `cargo xtask vm -- hello_world_c`)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <upnvme.h>

static const char MSG[] = "Hello world!\n";

struct state {
    struct upnvme_qpair *qp;
    int done;   /* 1 when the read has completed */
    int status; /* first failure, or UPNVME_OK */
};

static void read_done(void *arg, const struct upnvme_cpl *cpl)
{
    struct state *s = arg;
    if (cpl->status != UPNVME_OK && s->status == UPNVME_OK)
        s->status = cpl->status;
    s->done = 1;
}

static void write_done(void *arg, const struct upnvme_cpl *cpl)
{
    struct state *s = arg;
    if (cpl->status != UPNVME_OK) {
        fprintf(stderr, "write failed: %s (sct %u sc %#x)\n", upnvme_strerror(cpl->status),
                cpl->sct, cpl->sc);
        s->status = cpl->status;
        s->done = 1;
        return;
    }
    /* The buffer is ours again: clear it and read the block back into it,
     * submitting from inside the completion. */
    memset(upnvme_buf_data(cpl->buf), 0, upnvme_buf_len(cpl->buf));
    int rc = upnvme_read(s->qp, 1, cpl->buf, 0, 1, read_done, s);
    if (rc != UPNVME_OK) {
        fprintf(stderr, "read: %s\n", upnvme_last_error());
        s->status = rc;
        s->done = 1;
    }
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s failed (%s): %s\n", what, upnvme_strerror(rc), upnvme_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : NULL;
    struct upnvme_ctrl *ctrl = NULL;
    struct upnvme_qpair *qp = NULL;
    struct upnvme_buf *buf = NULL;
    int ret = 1; /* the exit status: 0 once the string came back */

    int rc = upnvme_ctrl_open(addr, NULL, &ctrl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_open", rc);
        goto out;
    }
    struct upnvme_ns_info ns;
    rc = upnvme_ns_get_info(ctrl, 1, &ns);
    if (rc != UPNVME_OK) {
        fail("upnvme_ns_get_info", rc);
        goto out;
    }
    printf("Attached to %s (libupnvme_c %s), namespace 1: %llu blocks of %u bytes\n",
           addr ? addr : "the only vfio-bound controller", upnvme_version(),
           (unsigned long long)ns.blocks, ns.lba_size);

    /* Identify Controller (opcode 06h, CNS 01h) through the admin
     * passthrough: the opcode's bits 1:0 (10b) say the data comes back. */
    unsigned char id[4096];
    struct upnvme_admin_cmd identify = {.opcode = 0x06, .cdw10 = 0x01};
    struct upnvme_admin_cpl cpl;
    rc = upnvme_ctrl_admin_passthru(ctrl, &identify, id, sizeof id, &cpl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_admin_passthru (Identify Controller)", rc);
        goto out;
    }
    /* Model Number: bytes 63:24, Serial Number: 23:4, ASCII, space padded. */
    printf("Controller: %.40s / serial %.20s\n", (const char *)id + 24, (const char *)id + 4);

    rc = upnvme_qpair_create(ctrl, NULL, &qp);
    if (rc != UPNVME_OK) {
        fail("upnvme_qpair_create", rc);
        goto out;
    }
    rc = upnvme_buf_alloc(ctrl, ns.lba_size, &buf);
    if (rc != UPNVME_OK) {
        fail("upnvme_buf_alloc", rc);
        goto out;
    }
    memcpy(upnvme_buf_data(buf), MSG, sizeof(MSG) - 1);

    struct state s = {.qp = qp, .done = 0, .status = UPNVME_OK};
    rc = upnvme_write(qp, 1, buf, 0, 1, write_done, &s);
    if (rc != UPNVME_OK) {
        fail("upnvme_write", rc);
        goto out;
    }

    /* Poll; give up after 10 s (nothing waits forever). */
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!s.done) {
        rc = upnvme_qpair_process_completions(qp, 0);
        if (rc < 0) {
            fail("upnvme_qpair_process_completions", rc);
            goto out;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10) {
            fprintf(stderr, "no completion after 10 s\n");
            goto out;
        }
    }
    if (s.status != UPNVME_OK) {
        fprintf(stderr, "I/O failed: %s\n", upnvme_strerror(s.status));
        goto out;
    }
    const char *back = upnvme_buf_data(buf);
    fwrite(back, 1, sizeof(MSG) - 1, stdout);
    if (memcmp(back, MSG, sizeof(MSG) - 1) != 0) {
        fprintf(stderr, "read back something else than was written\n");
        goto out;
    }
    ret = 0;

out:
    /* Every path ends here, so the controller is always shut down (CC.SHN).
     * A pair with a command still in flight (the timeout above) refuses to
     * go with UPNVME_EBUSY; once the controller is closed that command can
     * never complete, and destroying the pair ends it with UPNVME_ENODEV. */
    if (qp && upnvme_qpair_destroy(qp) == UPNVME_OK)
        qp = NULL;
    if (ctrl && (rc = upnvme_ctrl_close(ctrl)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_ctrl_close", rc);
    if (qp && (rc = upnvme_qpair_destroy(qp)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_qpair_destroy", rc);
    if (buf && (rc = upnvme_buf_free(buf)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_buf_free", rc);
    return ret;
}
