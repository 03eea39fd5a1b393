/*
 * Admin operations from C: Identify Controller and Identify Namespace through
 * upnvme_ctrl_admin_passthru, Get Features (completion dword 0), the SMART /
 * Health log, a controller reset with a queue pair living across it, and
 * (with --format-same NSID) a Format NVM of a namespace to the LBA format it
 * already has, which erases its data.
 *
 *   cc -o admin_c admin.c $(pkg-config --cflags --libs upnvme)
 *   ./admin_c [0000:00:04.0] [--format-same NSID]
 *
 * (inside the test bed: `cargo xtask vm -- admin_c`)
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <upnvme.h>

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s failed (%s): %s\n", what, upnvme_strerror(rc), upnvme_last_error());
    return 1;
}

struct done {
    int done;
    int status;
};

static void on_done(void *arg, const struct upnvme_cpl *cpl)
{
    struct done *d = arg;
    d->status = cpl->status;
    d->done = 1;
}

/* One command on `qp`, waited for (at most 10 s: nothing waits forever). */
static int io(struct upnvme_qpair *qp, int write, uint32_t nsid, struct upnvme_buf *buf)
{
    struct done d = {0, UPNVME_OK};
    int rc = write ? upnvme_write(qp, nsid, buf, 0, 1, on_done, &d)
                   : upnvme_read(qp, nsid, buf, 0, 1, on_done, &d);
    if (rc != UPNVME_OK)
        return rc;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!d.done) {
        rc = upnvme_qpair_process_completions(qp, 0);
        if (rc < 0)
            return rc;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10)
            return UPNVME_ETIMEDOUT;
    }
    return d.status;
}

int main(int argc, char **argv)
{
    const char *addr = NULL;
    uint32_t format_nsid = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--format-same") == 0 && i + 1 < argc)
            format_nsid = (uint32_t)strtoul(argv[++i], NULL, 0);
        else
            addr = argv[i];
    }
    struct upnvme_ctrl *ctrl = NULL;
    struct upnvme_qpair *qp = NULL;
    struct upnvme_buf *buf = NULL;
    int ret = 1;
    int rc = upnvme_ctrl_open(addr, NULL, &ctrl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_open", rc);
        goto out;
    }

    /* Identify Controller (06h, CNS 01h): data from the controller. */
    unsigned char page[4096];
    struct upnvme_admin_cmd cmd = {.opcode = 0x06, .cdw10 = 0x01};
    struct upnvme_admin_cpl cpl;
    rc = upnvme_ctrl_admin_passthru(ctrl, &cmd, page, sizeof page, &cpl);
    if (rc != UPNVME_OK) {
        fail("Identify Controller", rc);
        goto out;
    }
    printf("model: %.40s\nserial: %.20s\n", (const char *)page + 24, (const char *)page + 4);

    /* Get Features, Number of Queues (0Ah, FID 07h): the answer is dword 0. */
    cmd = (struct upnvme_admin_cmd){.opcode = 0x0a, .cdw10 = 0x07};
    rc = upnvme_ctrl_admin_passthru(ctrl, &cmd, NULL, 0, &cpl);
    if (rc != UPNVME_OK) {
        fail("Get Features (Number of Queues)", rc);
        goto out;
    }
    printf("queues: %u submission, %u completion\n", (cpl.dw0 & 0xffff) + 1, (cpl.dw0 >> 16) + 1);

    /* An NVMe error status comes back in cpl: Get Features of a reserved FID. */
    cmd = (struct upnvme_admin_cmd){.opcode = 0x0a, .cdw10 = 0xee};
    rc = upnvme_ctrl_admin_passthru(ctrl, &cmd, NULL, 0, &cpl);
    printf("reserved feature: %s, sct %u sc 0x%02x\n", upnvme_strerror(rc), cpl.sct, cpl.sc);

    unsigned char smart[512];
    rc = upnvme_ctrl_get_log_page(ctrl, 0x02, 0xffffffffu, 0, smart, sizeof smart);
    if (rc != UPNVME_OK) {
        fail("SMART / Health log", rc);
        goto out;
    }
    printf("temperature: %u K\n", (unsigned)(smart[1] | smart[2] << 8));

    /* A queue pair across a controller reset: written before, read after. */
    struct upnvme_ns_info ns;
    rc = upnvme_ns_get_info(ctrl, 1, &ns);
    if (rc != UPNVME_OK) {
        fail("upnvme_ns_get_info", rc);
        goto out;
    }
    rc = upnvme_qpair_create(ctrl, NULL, &qp);
    if (rc != UPNVME_OK) {
        fail("upnvme_qpair_create", rc);
        goto out;
    }
    /* One block: what a command moves. (The C API's reads and writes take
     * namespaces without metadata; with metadata, only the reset is shown.) */
    int plain = ns.metadata_size == 0;
    size_t len = ns.lba_size;
    rc = upnvme_buf_alloc(ctrl, len, &buf);
    if (rc != UPNVME_OK) {
        fail("upnvme_buf_alloc", rc);
        goto out;
    }
    unsigned char *data = upnvme_buf_data(buf);
    for (size_t i = 0; i < len; i++)
        data[i] = (unsigned char)(i * 7 + 1);
    if (plain) {
        if ((rc = io(qp, 1, 1, buf)) != UPNVME_OK) {
            fail("write before the reset", rc);
            goto out;
        }
    }
    rc = upnvme_ctrl_reset(ctrl);
    if (rc != UPNVME_OK) {
        fail("upnvme_ctrl_reset", rc);
        goto out;
    }
    if (plain) {
        memset(data, 0, len);
        if ((rc = io(qp, 0, 1, buf)) != UPNVME_OK) {
            fail("read after the reset", rc);
            goto out;
        }
        for (size_t i = 0; i < len; i++) {
            if (data[i] != (unsigned char)(i * 7 + 1)) {
                fprintf(stderr, "byte %zu after the reset: 0x%02x\n", i, data[i]);
                goto out;
            }
        }
        printf("reset: the pair carried on, block 0 of namespace 1 read back whole\n");
    } else {
        printf("reset: done\n");
    }

    if (format_nsid != 0) {
        /* Identify Namespace (CNS 00h) for its current format: FLBAS
         * (byte 26) and DPS (byte 29). */
        cmd = (struct upnvme_admin_cmd){.opcode = 0x06, .nsid = format_nsid};
        rc = upnvme_ctrl_admin_passthru(ctrl, &cmd, page, sizeof page, &cpl);
        if (rc != UPNVME_OK) {
            fail("Identify Namespace", rc);
            goto out;
        }
        uint8_t flbas = page[26], dps = page[29];
        struct upnvme_format f = {
            .lbaf = (uint8_t)((flbas & 0x0f) | ((flbas >> 5) & 0x03) << 4),
            .mset = (flbas >> 4) & 1,
            .pi = dps & 0x07,
            .pil = (dps >> 3) & 1,
        };
        rc = upnvme_ctrl_format_nvm(ctrl, format_nsid, &f);
        if (rc != UPNVME_OK) {
            fail("upnvme_ctrl_format_nvm", rc);
            goto out;
        }
        struct upnvme_ns_info after;
        rc = upnvme_ns_get_info(ctrl, format_nsid, &after);
        if (rc != UPNVME_OK) {
            fail("upnvme_ns_get_info after the format", rc);
            goto out;
        }
        printf("format: namespace %u: LBA format %u, %u-byte blocks, %llu blocks\n", format_nsid,
               f.lbaf, after.lba_size, (unsigned long long)after.blocks);
        if (format_nsid == 1 && after.metadata_size == 0) {
            if ((rc = io(qp, 0, 1, buf)) != UPNVME_OK) {
                fail("read after the format", rc);
                goto out;
            }
            printf("format: the pair read namespace 1 after it\n");
        }
    }
    ret = 0;

out:
    if (buf && upnvme_buf_free(buf) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_buf_free", UPNVME_EBUSY);
    if (qp && (rc = upnvme_qpair_destroy(qp)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_qpair_destroy", rc);
    if (ctrl && (rc = upnvme_ctrl_close(ctrl)) != UPNVME_OK && ret == 0)
        ret = fail("upnvme_ctrl_close", rc);
    return ret;
}
