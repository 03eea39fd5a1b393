/*
 * NVM commands beyond read and write, from C: Copy (upnvme_copy, the
 * controller moves blocks without the host touching the data), a raw
 * command (upnvme_io_passthru), Compare, Verify and Write Uncorrectable.
 *
 * 1. Writes two 2-block patterns to namespace 1, copies them in reverse
 *    order to another LBA of namespace 1 (one Copy, two source ranges), reads
 *    the 4 blocks back and compares. Without Copy (ONCS bit 8) it checks the
 *    refusal (ENOTSUP), writes those blocks instead and skips step 5.
 * 2. The copied blocks again through upnvme_io_passthru (a raw Read), and an
 *    opcode the controller lacks (Invalid Command Opcode in the completion).
 * 3. Compare, where the controller reports it (ONCS bit 0; else the call
 *    is refused with ENOTSUP): the copied blocks against what they should
 *    hold (success), then against data with one byte changed (Compare
 *    Failure, SCT 2h SC 85h).
 * 4. Verify of the copied blocks and Write Uncorrectable, each where the
 *    controller reports it (ONCS bits 7 and 1; else the call is refused with
 *    ENOTSUP): one block marked uncorrectable fails a Read (Unrecovered Read
 *    Error, 2h/81h) until a Write makes it readable again.
 * 5. Where namespace 2 has the same block size and no metadata and the
 *    controller takes cross-namespace Copy formats (upnvme_ctrl_info's
 *    ocfs & cdfe, bit 2), writes a pattern to namespace 2 and copies it, after
 *    a range of namespace 1, into namespace 1 (snsid 2), then compares.
 *
 *   cc -o commands_c commands.c $(pkg-config --cflags --libs upnvme)
 *   ./commands_c [0000:00:04.0]
 *
 * It uses blocks 60000 and up of each namespace (their data is overwritten).
 * (inside the test bed: `cargo xtask vm -- commands_c`)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <upnvme.h>

/* Where the example writes; a namespace smaller than this many blocks
 * plus 16 is refused. */
#define BASE 60000u

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s failed (%s): %s\n", what, upnvme_strerror(rc), upnvme_last_error());
    return 1;
}

struct done {
    int done;
    int status;
    uint8_t sct, sc;
};

static void on_done(void *arg, const struct upnvme_cpl *cpl)
{
    struct done *d = arg;
    d->status = cpl->status;
    d->sct = cpl->sct;
    d->sc = cpl->sc;
    d->done = 1;
}

/* Polls until `d` is done, at most 10 s (nothing waits forever). */
static int wait_for(struct upnvme_qpair *qp, struct done *d)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!d->done) {
        int rc = upnvme_qpair_process_completions(qp, 0);
        if (rc < 0)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10)
            return UPNVME_ETIMEDOUT;
    }
    if (d->status != UPNVME_OK)
        fprintf(stderr, "command failed: sct %u sc %#x\n", d->sct, d->sc);
    return d->status;
}

/* Writes (write != 0) or reads `blocks` blocks at `slba` of `nsid`. `d` is
 * main's, not this function's: a command given up after wait_for's 10 s
 * keeps it until the pair is destroyed after the close, which runs its
 * callback (UPNVME_ENODEV) after this function has returned. */
static int rw(struct upnvme_qpair *qp, struct done *d, int write, uint32_t nsid,
              struct upnvme_buf *buf, uint64_t slba, uint32_t blocks)
{
    *d = (struct done){0};
    int rc = write ? upnvme_write(qp, nsid, buf, slba, blocks, on_done, d)
                   : upnvme_read(qp, nsid, buf, slba, blocks, on_done, d);
    return rc != UPNVME_OK ? rc : wait_for(qp, d);
}

/* A Copy, `d` as in rw. */
static int copy(struct upnvme_qpair *qp, struct done *d, uint32_t nsid, uint64_t sdlba,
                const struct upnvme_copy_range *ranges, uint32_t count)
{
    *d = (struct done){0};
    int rc = upnvme_copy(qp, nsid, sdlba, ranges, count, on_done, d);
    return rc != UPNVME_OK ? rc : wait_for(qp, d);
}

/* Waits for the command `rc` says was submitted with `d`. */
static int sent(struct upnvme_qpair *qp, int rc, struct done *d)
{
    return rc != UPNVME_OK ? rc : wait_for(qp, d);
}

/* Fills `len` bytes with a pattern of `seed`. */
static void fill(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + i / 4093);
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : NULL;
    struct upnvme_ctrl *ctrl = NULL;
    struct upnvme_qpair *qp = NULL;
    struct upnvme_buf *buf = NULL;
    uint8_t *want = NULL;
    /* Every command's completion: alive until main returns, past the
     * callbacks the pair's destroy runs (see rw). */
    struct done d = {0};
    int ret = 1;

    int rc = upnvme_ctrl_open(addr, NULL, &ctrl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_open", rc);
        goto out;
    }
    struct upnvme_ctrl_info info;
    rc = upnvme_ctrl_get_info(ctrl, &info);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_get_info", rc);
        goto out;
    }
    int has_copy = !!(info.oncs & UPNVME_ONCS_COPY);
    struct upnvme_ns_info ns1;
    rc = upnvme_ns_get_info(ctrl, 1, &ns1);
    if (rc != UPNVME_OK) {
        fail("upnvme_ns_get_info", rc);
        goto out;
    }
    if (ns1.metadata_size != 0 || ns1.blocks < BASE + 16) {
        fprintf(stderr, "namespace 1 needs no metadata and %u blocks\n", BASE + 16);
        goto out;
    }
    size_t lba = ns1.lba_size;
    rc = upnvme_qpair_create(ctrl, NULL, &qp);
    if (rc != UPNVME_OK) {
        fail("upnvme_qpair_create", rc);
        goto out;
    }
    rc = upnvme_buf_alloc(ctrl, 4 * lba, &buf);
    if (rc != UPNVME_OK) {
        fail("upnvme_buf_alloc", rc);
        goto out;
    }
    want = malloc(4 * lba);
    if (!want)
        goto out;
    uint8_t *data = upnvme_buf_data(buf);

    /* 1. Within namespace 1: A at BASE, B at BASE + 2, then B, A at BASE + 8. */
    fill(data, 4 * lba, 1);
    rc = rw(qp, &d, 1, 1, buf, BASE, 4);
    if (rc != UPNVME_OK) {
        fail("upnvme_write", rc);
        goto out;
    }
    memcpy(want, data + 2 * lba, 2 * lba);
    memcpy(want + 2 * lba, data, 2 * lba);
    struct upnvme_copy_range within[2] = {
        {.slba = BASE + 2, .blocks = 2, .snsid = 0},
        {.slba = BASE, .blocks = 2, .snsid = 1},
    };
    if (has_copy) {
        rc = copy(qp, &d, 1, BASE + 8, within, 2);
        if (rc != UPNVME_OK) {
            fail("upnvme_copy", rc);
            goto out;
        }
    } else {
        /* Refused, nothing sent: the blocks the Copy would have made are
         * written instead, for the steps below. */
        rc = upnvme_copy(qp, 1, BASE + 8, within, 2, NULL, NULL);
        if (rc != UPNVME_ENOTSUP) {
            fprintf(stderr, "copy without ONCS bit 8: %d, not ENOTSUP\n", rc);
            goto out;
        }
        printf("copy: not supported (ONCS bit 8 clear), refused\n");
        memcpy(data, want, 4 * lba);
        rc = rw(qp, &d, 1, 1, buf, BASE + 8, 4);
        if (rc != UPNVME_OK) {
            fail("upnvme_write", rc);
            goto out;
        }
    }
    memset(data, 0, 4 * lba);
    rc = rw(qp, &d, 0, 1, buf, BASE + 8, 4);
    if (rc != UPNVME_OK) {
        fail("upnvme_read", rc);
        goto out;
    }
    if (memcmp(data, want, 4 * lba) != 0) {
        fprintf(stderr, "copy: the copied blocks differ from the sources\n");
        goto out;
    }
    if (has_copy)
        printf("copy: 2 ranges within namespace 1, 4 blocks of %zu bytes, read back equal\n",
               lba);

    /* 2. The same blocks through upnvme_io_passthru: a raw Read (02h),
     * SLBA in CDW10-11, NLB (0-based) in CDW12; then an opcode the
     * controller does not have (C4h, vendor specific), which completes with
     * Invalid Command Opcode (sct 0 sc 0x01). */
    memset(data, 0, 4 * lba);
    struct upnvme_io_cmd raw = {.opcode = 0x02, .nsid = 1, .cdw10 = BASE + 8, .cdw12 = 3};
    d = (struct done){0};
    rc = sent(qp, upnvme_io_passthru(qp, &raw, buf, 4 * lba, on_done, &d), &d);
    if (rc != UPNVME_OK) {
        fail("upnvme_io_passthru (Read)", rc);
        goto out;
    }
    if (memcmp(data, want, 4 * lba) != 0) {
        fprintf(stderr, "io passthru: the raw Read brought other data\n");
        goto out;
    }
    struct upnvme_io_cmd vendor = {.opcode = 0xc4, .nsid = 1};
    d = (struct done){0};
    rc = upnvme_io_passthru(qp, &vendor, NULL, 0, on_done, &d);
    if (rc != UPNVME_OK || wait_for(qp, &d) != UPNVME_EIO || d.sct != 0 || d.sc != 0x01) {
        fprintf(stderr, "io passthru of opcode C4h: rc %d status %d sct %u sc %#x\n", rc,
                d.status, d.sct, d.sc);
        goto out;
    }
    printf("io passthru: a raw Read matched, opcode 0xc4 is Invalid Command Opcode (sct 0 sc "
           "0x01)\n");

    /* 3. Compare, where the controller reports it (ONCS bit 0): equal, then
     * one byte different. The data is `want`'s. */
    if (!(info.oncs & UPNVME_ONCS_COMPARE)) {
        rc = upnvme_compare(qp, 1, buf, BASE + 8, 4, NULL, NULL);
        if (rc != UPNVME_ENOTSUP) {
            fprintf(stderr, "compare without ONCS bit 0: %d, not ENOTSUP\n", rc);
            goto out;
        }
        printf("compare: not supported (ONCS bit 0 clear), refused\n");
    } else {
        d = (struct done){0};
        rc = sent(qp, upnvme_compare(qp, 1, buf, BASE + 8, 4, on_done, &d), &d);
        if (rc != UPNVME_OK) {
            fail("upnvme_compare", rc);
            goto out;
        }
        data[3 * lba + 17] ^= 0x40;
        d = (struct done){0};
        rc = upnvme_compare(qp, 1, buf, BASE + 8, 4, on_done, &d);
        if (rc != UPNVME_OK || wait_for(qp, &d) != UPNVME_EIO || d.sct != 2 || d.sc != 0x85) {
            fprintf(stderr, "compare of different data: rc %d status %d sct %u sc %#x, not "
                            "Compare Failure\n", rc, d.status, d.sct, d.sc);
            goto out;
        }
        printf("compare: equal blocks match, a changed byte is Compare Failure (sct 2 sc 0x85)\n");
    }

    /* 4. Verify, Write Uncorrectable. */
    if (info.oncs & UPNVME_ONCS_VERIFY) {
        d = (struct done){0};
        rc = sent(qp, upnvme_verify(qp, 1, BASE + 8, 4, on_done, &d), &d);
        if (rc != UPNVME_OK) {
            fail("upnvme_verify", rc);
            goto out;
        }
        printf("verify: 4 blocks read and checked on the controller\n");
    } else {
        rc = upnvme_verify(qp, 1, BASE + 8, 4, NULL, NULL);
        if (rc != UPNVME_ENOTSUP) {
            fprintf(stderr, "verify without ONCS bit 7: %d, not ENOTSUP\n", rc);
            goto out;
        }
        printf("verify: not supported (ONCS bit 7 clear), refused\n");
    }
    if (!(info.oncs & UPNVME_ONCS_WRITE_UNCORRECTABLE)) {
        rc = upnvme_write_uncorrectable(qp, 1, BASE + 9, 1, NULL, NULL);
        if (rc != UPNVME_ENOTSUP) {
            fprintf(stderr, "write uncorrectable without ONCS bit 1: %d, not ENOTSUP\n", rc);
            goto out;
        }
        printf("write uncorrectable: not supported (ONCS bit 1 clear), refused\n");
    } else {
        d = (struct done){0};
        rc = sent(qp, upnvme_write_uncorrectable(qp, 1, BASE + 9, 1, on_done, &d), &d);
        if (rc != UPNVME_OK) {
            fail("upnvme_write_uncorrectable", rc);
            goto out;
        }
        d = (struct done){0};
        rc = upnvme_read(qp, 1, buf, BASE + 9, 1, on_done, &d);
        if (rc != UPNVME_OK || wait_for(qp, &d) != UPNVME_EIO || d.sct != 2 || d.sc != 0x81) {
            fprintf(stderr, "read of an uncorrectable block: rc %d sct %u sc %#x\n", rc, d.sct,
                    d.sc);
            goto out;
        }
        /* Written again, the block reads: restore block BASE + 9. */
        memcpy(data, want + lba, lba);
        rc = rw(qp, &d, 1, 1, buf, BASE + 9, 1);
        if (rc != UPNVME_OK) {
            fail("upnvme_write", rc);
            goto out;
        }
        printf("write uncorrectable: the block failed a Read (sct 2 sc 0x81) until written\n");
    }

    /* 5. Across namespaces, where namespace 2 matches and Format 2h is on. */
    if (!has_copy) {
        ret = 0;
        goto out;
    }
    struct upnvme_ns_info ns2;
    if (upnvme_ns_get_info(ctrl, 2, &ns2) != UPNVME_OK || ns2.lba_size != ns1.lba_size ||
        ns2.metadata_size != 0 || ns2.blocks < BASE + 16) {
        printf("copy: no namespace 2 like namespace 1, no cross-namespace copy\n");
        ret = 0;
        goto out;
    }
    if (!(info.ocfs & info.cdfe & (1u << 2))) {
        /* The library refuses it, nothing sent. */
        struct upnvme_copy_range r = {.slba = BASE, .blocks = 1, .snsid = 2};
        rc = upnvme_copy(qp, 1, BASE + 12, &r, 1, NULL, NULL);
        if (rc != UPNVME_ENOTSUP) {
            fprintf(stderr, "cross-namespace copy without Format 2h: %d, not ENOTSUP\n", rc);
            goto out;
        }
        printf("copy: cross-namespace copy refused (ocfs %#x, cdfe %#x): %s\n", info.ocfs,
               info.cdfe, upnvme_last_error());
        ret = 0;
        goto out;
    }
    fill(data, 3 * lba, 2);
    rc = rw(qp, &d, 1, 2, buf, BASE, 3);
    if (rc != UPNVME_OK) {
        fail("upnvme_write (namespace 2)", rc);
        goto out;
    }
    /* Namespace 1's own range first: QEMU 10.0.2 reads a range whose SNSID
     * is the destination's from the previous range's namespace when it
     * comes after another namespace's range. */
    memcpy(want, want + 3 * lba, lba); /* BASE + 11: A's second block */
    memcpy(want + lba, data, 3 * lba);
    struct upnvme_copy_range across[2] = {
        {.slba = BASE + 11, .blocks = 1, .snsid = 0},
        {.slba = BASE, .blocks = 3, .snsid = 2},
    };
    rc = copy(qp, &d, 1, BASE + 12, across, 2);
    if (rc != UPNVME_OK) {
        fail("upnvme_copy (cross-namespace)", rc);
        goto out;
    }
    memset(data, 0, 4 * lba);
    rc = rw(qp, &d, 0, 1, buf, BASE + 12, 4);
    if (rc != UPNVME_OK) {
        fail("upnvme_read", rc);
        goto out;
    }
    if (memcmp(data, want, 4 * lba) != 0) {
        fprintf(stderr, "copy: the cross-namespace copy differs from the sources\n");
        goto out;
    }
    printf("copy: namespace 1 and namespace 2 into namespace 1, 4 blocks, read back equal\n");
    ret = 0;

out:
    /* As in hello_world.c: a pair with a command still in flight (a
     * timeout) refuses to go until the controller is closed. */
    if (qp && upnvme_qpair_destroy(qp) == UPNVME_OK)
        qp = NULL;
    if (ctrl && (rc = upnvme_ctrl_close(ctrl)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_ctrl_close", rc);
    if (qp && (rc = upnvme_qpair_destroy(qp)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_qpair_destroy", rc);
    if (buf && (rc = upnvme_buf_free(buf)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_buf_free", rc);
    free(want);
    return ret;
}
