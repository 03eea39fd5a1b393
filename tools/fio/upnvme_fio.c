/*
 * fio ioengine over upnvme's C API (libupnvme_c).
 *
 *   fio --ioengine=external:/path/upnvme_fio.so --thread=1 \
 *       --filename='traddr=0000.00.04.0 ns=1' --rw=randread --bs=4k --iodepth=16 ...
 *
 * The filename follows SPDK's plugin: `traddr=` the PCI address with '.' for
 * ':' (fio splits file names at ':'), `ns=` the NSID (default 1). A filename
 * without '=' (e.g. fio's default, the job name) means namespace 1 of the only
 * NVMe controller bound to vfio-pci. Several jobs and files may share one
 * controller: it is opened once per process. Each fio thread has its own queue
 * pair per file (thread=1 is required: a controller cannot be shared across
 * processes).
 *
 * Engine options: upnvme_shadow_doorbells=0|1 (default 0: MMIO doorbells only,
 * the library's default), upnvme_reap_on_submit=0|1 (default 0),
 * upnvme_entries=N (SQ entries, default: the library's),
 * upnvme_sq_announce_each=0|1 (with shadow doorbells; default 0: the library's
 * default, each batch announced once below 65 commands in flight and each
 * command from 65 on).
 *
 * End-to-end protection information (a namespace formatted with PI whose
 * metadata is only the PI tuple: 8 bytes, 16 with a 64-bit guard):
 * upnvme_pi_act=1 (PRACT: the controller generates each block's tuple on a
 * write and checks and strips it on a read, so the buffers carry data only),
 * upnvme_pi_chk=GUARD,REFTAG,APPTAG (the checks, any of them; default none),
 * upnvme_apptag=N and upnvme_apptag_mask=N (the Application Tag and the bits
 * checked; defaults 0x1234 and 0xffff, as fio's io_uring_cmd engine). Other
 * namespaces with metadata are refused: the engine passes no metadata buffers.
 *
 * Memory: fio's I/O buffers are one DMA buffer (iomem_alloc), split into one
 * piece per io_u (each I/O owns its piece while in flight). Completion times are
 * fio's own: getevents returns the io_us as soon as their completions are reaped.
 *
 * Built against the source tree of the fio that loads it (fio.h and the
 * config-host.h its configure wrote): fio loads an engine only if its
 * FIO_IOOPS_VERSION matches. `cargo xtask fio` does this; see docs/fio.md.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fio.h"
#include "optgroup.h"
#include "verify.h"

#include <upnvme.h>

/* Engine options (td->eo); the first member must be a pointer (fio's rule). */
struct upnvme_fio_options {
	void *pad;
	unsigned int shadow_doorbells;
	unsigned int reap_on_submit;
	unsigned int entries;
	unsigned int sq_announce_each;
	unsigned int pi_act;
	char *pi_chk;
	unsigned int apptag;
	unsigned int apptag_mask;
};

static struct fio_option options[] = {
	{
		.name = "upnvme_shadow_doorbells",
		.lname = "upnvme shadow doorbells",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct upnvme_fio_options, shadow_doorbells),
		.def = "0",
		.help = "Set up shadow doorbells (Doorbell Buffer Config) and let their EventIdx skip MMIO doorbell writes (default: MMIO doorbells only)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_reap_on_submit",
		.lname = "upnvme reap on submit",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct upnvme_fio_options, reap_on_submit),
		.def = "0",
		.help = "Reap completions right after each SQ doorbell",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_entries",
		.lname = "upnvme queue entries",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct upnvme_fio_options, entries),
		.def = "0",
		.help = "Submission queue entries per queue pair (0: the library's default)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_sq_announce_each",
		.lname = "upnvme announce each command",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct upnvme_fio_options, sq_announce_each),
		.def = "0",
		.help = "Announce every queued command to the controller at once (default: per batch up to 64 in flight)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_pi_act",
		.lname = "upnvme protection information action",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct upnvme_fio_options, pi_act),
		.def = "0",
		.help = "PRACT: the controller generates protection information on writes and "
			"checks and strips it on reads (a namespace whose metadata is only the PI tuple)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_pi_chk",
		.lname = "upnvme protection information checks",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct upnvme_fio_options, pi_chk),
		.def = "",
		.help = "Protection information checks (PRCHK): a comma list of GUARD, REFTAG, APPTAG",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_apptag",
		.lname = "upnvme application tag",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct upnvme_fio_options, apptag),
		.def = "0x1234",
		.help = "Logical Block Application Tag written with PRACT and checked with APPTAG",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "upnvme_apptag_mask",
		.lname = "upnvme application tag mask",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct upnvme_fio_options, apptag_mask),
		.def = "0xffff",
		.help = "Which Application Tag bits APPTAG checks",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* One opened controller, shared by every thread and file that names it. */
struct shared_ctrl {
	struct shared_ctrl *next;
	char addr[32]; /* "dddd:bb:dd.f", also for the only vfio-bound controller */
	struct upnvme_ctrl *ctrl;
	unsigned int refs;
	int shadow_doorbells; /* the option it was opened with */
	/* Identify Controller ONCS (UPNVME_ONCS_*): the optional commands
	 * the controller offers, which its queue pairs refuse otherwise. */
	uint16_t oncs;
};

static pthread_mutex_t ctrls_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared_ctrl *ctrls;
static struct upnvme_fio_file *files_all; /* under ctrls_lock */

/* Per file (per thread): its controller, namespace and queue pair. Kept on a
 * list of their own: fio frees its file structures before the engine's cleanup,
 * which releases these (and the controller references) by owner. */
struct upnvme_fio_file {
	struct upnvme_fio_file *next;
	struct thread_data *owner;
	struct shared_ctrl *sc;
	uint32_t nsid;
	uint32_t lba_size;
	/* UPNVME_PI_* bits for each read and write (0: no protection fields),
	 * and the Application Tag and its mask. */
	uint32_t pi;
	uint16_t apptag, apptag_mask;
	struct upnvme_qpair *qp;
	/* The last process_completions' error on `qp` (0: it succeeded): its
	 * commands in flight may never complete (a failed controller). */
	int poll_rc;
	/* Its job's thread has started (ran init): from then on only that
	 * thread's cleanup releases the file (under ctrls_lock). */
	int started;
};

/* Per io_u: its piece of the I/O memory, and the way back to the thread. */
struct upnvme_fio_iou {
	struct upnvme_fio_thread *t;
	struct io_u *io_u;
	struct upnvme_buf *piece;
	unsigned int gen;            /* the split `piece` came from */
};

/* Per thread. */
struct upnvme_fio_thread {
	struct io_u **events;
	unsigned int nr_events;
	unsigned int max_events;
	struct upnvme_buf *mem;      /* the I/O memory before it is split */
	struct upnvme_buf **pieces;  /* after post_init */
	size_t nr_pieces;
	char *mem_base;
	size_t piece_len;
	/* Bumped by every split and every free of the I/O memory: an io_u
	 * whose `gen` differs holds no valid piece (fio frees and allocates
	 * its I/O memory again mid-run when it replays an iolog in chunks or
	 * a blktrace, without calling post_init). */
	unsigned int gen;
	/* io_us queued since the last commit: their doorbell, submission
	 * statistics and issue time come with the commit. */
	struct io_u **queued_ious;
	unsigned int queued;
	/* The file getevents polls first: the one after the file it started
	 * with last time, so that with several files and a small `max` no
	 * file's completions wait behind the others'. */
	unsigned int poll_from;
};

/* The errno fio reports for a UPNVME_E* code: the C API's codes are
 * negative errno values, but for its own two (setup and internal errors),
 * which have none and become EIO. */
static int errno_of(int rc)
{
	if (rc == UPNVME_ESETUP || rc == UPNVME_EINTERNAL || rc >= 0)
		return EIO;
	return -rc;
}

static int fail(struct thread_data *td, const char *what, int rc)
{
	log_err("upnvme: %s: %s (%s)\n", what, upnvme_last_error(), upnvme_strerror(rc));
	td_verror(td, errno_of(rc), what);
	return 1;
}

/* Rewrites `addr` ("DDDD:BB:DD.F" or "BB:DD.F", hexadecimal in either
 * case) as "dddd:bb:dd.f", so that two spellings of one controller find
 * the same shared controller. Returns -1 when it is not a PCI address. */
static int normalize_pci_addr(char *addr, size_t addr_len)
{
	unsigned int dom = 0, bus = 0, dev = 0, fn = 0;
	int used = 0;
	bool full = sscanf(addr, "%x:%x:%x.%x%n", &dom, &bus, &dev, &fn, &used) == 4 &&
		    !addr[used];
	if (!full) {
		dom = 0;
		used = 0;
		if (sscanf(addr, "%x:%x.%x%n", &bus, &dev, &fn, &used) != 3 || addr[used])
			return -1;
	}
	if (dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7 || addr_len < 13)
		return -1;
	snprintf(addr, addr_len, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
	return 0;
}

/* Parses "traddr=0000.00.04.0 ns=1" (either key optional; SPDK's
 * "trtype=PCIe" is accepted and ignored). Says what is wrong itself. */
static int parse_filename(const char *name, char *addr, size_t addr_len, uint32_t *nsid)
{
	addr[0] = '\0';
	*nsid = 1;
	if (!strchr(name, '='))
		return 0;
	char *copy = strdup(name);
	if (!copy)
		return -ENOMEM;
	int rc = 0;
	char *save = NULL;
	for (char *tok = strtok_r(copy, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
		if (!strncmp(tok, "traddr=", 7)) {
			const char *v = tok + 7;
			if (strlen(v) >= addr_len) {
				log_err("upnvme: filename '%s': traddr '%s' is too long for a PCI address\n",
					name, v);
				rc = -EINVAL;
				break;
			}
			strcpy(addr, v);
			/* fio takes ':' in a filename as a separator, so the address
			 * comes with dots: every dot but the last (the function's) is a
			 * colon. 0000.00.04.0 -> 0000:00:04.0, 00.04.0 -> 00:04.0. */
			char *last = strrchr(addr, '.');
			for (char *p = addr; *p; p++)
				if (*p == '.' && p != last)
					*p = ':';
			if (normalize_pci_addr(addr, addr_len)) {
				log_err("upnvme: filename '%s': traddr '%s' is not a PCI address "
					"(DDDD.BB.DD.F or BB.DD.F, hexadecimal)\n",
					name, v);
				rc = -EINVAL;
				break;
			}
		} else if (!strncmp(tok, "ns=", 3)) {
			char *end;
			unsigned long v = strtoul(tok + 3, &end, 10);
			if (*end || v == 0 || v > 0xfffffffeUL) {
				log_err("upnvme: filename '%s': '%s' is not a namespace ID (1 to 4294967294)\n",
					name, tok);
				rc = -EINVAL;
				break;
			}
			*nsid = (uint32_t)v;
		} else if (!strcasecmp(tok, "trtype=PCIe")) {
			/* SPDK's form; PCIe is the only transport here. */
		} else {
			log_err("upnvme: filename '%s': unknown key in '%s' (expected "
				"'traddr=DDDD.BB.DD.F ns=N')\n",
				name, tok);
			rc = -EINVAL;
			break;
		}
	}
	free(copy);
	return rc;
}

/* Whether fio may issue a block size or alignment for direction `d` that
 * is not a whole number of the namespace's blocks. */
static bool sizes_fit_blocks(struct thread_data *td, uint32_t lba, const char **what,
			     unsigned long long *value)
{
	if (td->o.bs_unaligned && lba > 1) {
		/* fio then issues any size between min and max, not only
		 * multiples of the smallest. */
		*what = "bs_unaligned=1 (any size in the range)";
		*value = td->o.min_bs[DDIR_READ];
		return false;
	}
	for (int d = DDIR_READ; d < DDIR_RWDIR_CNT; d++) {
		if (td->o.min_bs[d] % lba) {
			*what = "a block size (bs/bsrange/bssplit)";
			*value = td->o.min_bs[d];
			return false;
		}
		if (td->o.max_bs[d] % lba) {
			*what = "a block size (bs/bsrange/bssplit)";
			*value = td->o.max_bs[d];
			return false;
		}
		if (td->o.ba[d] % lba) {
			*what = "the block alignment (ba)";
			*value = td->o.ba[d];
			return false;
		}
	}
	return true;
}

/* The UPNVME_PI_CHECK_* bits of an upnvme_pi_chk list ("GUARD,REFTAG",
 * any case, ',' or ':' between); -1 for an unknown word (named on stderr). */
static int parse_pi_chk(const char *list, uint32_t *bits)
{
	*bits = 0;
	if (!list || !*list)
		return 0;
	char *copy = strdup(list);
	if (!copy)
		return -1;
	int rc = 0;
	char *save = NULL;
	for (char *w = strtok_r(copy, ",: ", &save); w; w = strtok_r(NULL, ",: ", &save)) {
		if (!strcasecmp(w, "GUARD")) {
			*bits |= UPNVME_PI_CHECK_GUARD;
		} else if (!strcasecmp(w, "REFTAG")) {
			*bits |= UPNVME_PI_CHECK_REF_TAG;
		} else if (!strcasecmp(w, "APPTAG")) {
			*bits |= UPNVME_PI_CHECK_APP_TAG;
		} else {
			log_err("upnvme: upnvme_pi_chk=%s: '%s' is not a check (GUARD, REFTAG or "
				"APPTAG)\n",
				list, w);
			rc = -1;
			break;
		}
	}
	free(copy);
	return rc;
}

/* What makes the job issue trims (Dataset Management, deallocate), or
 * NULL: its rw mode, or verify's trim_percentage with trim_backlog (fio
 * then trims blocks it wrote and verified). */
static const char *job_trims(struct thread_data *td)
{
	if (td_trim(td))
		return "its rw mode (trim, randtrim, trimwrite, randtrimwrite)";
	if (td->o.trim_percentage && td->o.trim_backlog)
		return "trim_percentage with trim_backlog";
	return NULL;
}

/* The controller at `name` ("dddd:bb:dd.f", or "" for the only vfio-bound
 * one), opened by the first file that names it and shared after that. ""
 * is resolved to its address first, so a job that names the controller
 * and one that does not share it (a second open of its VFIO group fails). */
static struct shared_ctrl *ctrl_get(struct thread_data *td, const char *name, int *err)
{
	struct upnvme_fio_options *o = td->eo;
	char addr[32];
	if (name[0]) {
		snprintf(addr, sizeof(addr), "%s", name);
	} else {
		int rc = upnvme_ctrl_default_addr(addr, sizeof(addr));
		if (rc != UPNVME_OK) {
			log_err("upnvme: no traddr in the filename, and %s\n", upnvme_last_error());
			*err = errno_of(rc);
			return NULL;
		}
	}
	pthread_mutex_lock(&ctrls_lock);
	for (struct shared_ctrl *c = ctrls; c; c = c->next)
		if (!strcmp(c->addr, addr)) {
			c->refs++;
			if ((o->shadow_doorbells != 0) != c->shadow_doorbells)
				log_info("upnvme: %s is open already with upnvme_shadow_doorbells=%d (the "
					 "first job's); this job's %d applies to its queue pairs only\n",
					 addr, c->shadow_doorbells, o->shadow_doorbells != 0);
			pthread_mutex_unlock(&ctrls_lock);
			return c;
		}
	struct shared_ctrl *c = calloc(1, sizeof(*c));
	if (!c) {
		pthread_mutex_unlock(&ctrls_lock);
		*err = ENOMEM;
		return NULL;
	}
	snprintf(c->addr, sizeof(c->addr), "%s", addr);
	struct upnvme_ctrl_opts opts;
	upnvme_ctrl_opts_default(&opts);
	opts.shadow_doorbells = o->shadow_doorbells != 0;
	int rc = upnvme_ctrl_open(addr, &opts, &c->ctrl);
	if (rc != UPNVME_OK) {
		log_err("upnvme: opening %s: %s\n", addr, upnvme_last_error());
		free(c);
		pthread_mutex_unlock(&ctrls_lock);
		*err = errno_of(rc);
		return NULL;
	}
	struct upnvme_ctrl_info info = {0};
	rc = upnvme_ctrl_get_info(c->ctrl, &info);
	if (rc != UPNVME_OK || !UPNVME_CTRL_INFO_HAS(&info, oncs)) {
		log_err("upnvme: %s: reading what the controller supports: %s\n", addr,
			rc != UPNVME_OK ? upnvme_last_error() : "the library filled too little");
		upnvme_ctrl_close(c->ctrl);
		free(c);
		pthread_mutex_unlock(&ctrls_lock);
		*err = rc != UPNVME_OK ? errno_of(rc) : EIO;
		return NULL;
	}
	c->oncs = info.oncs;
	c->refs = 1;
	c->shadow_doorbells = o->shadow_doorbells != 0;
	c->next = ctrls;
	ctrls = c;
	pthread_mutex_unlock(&ctrls_lock);
	return c;
}

/* Drops one reference; the last one shuts the controller down (CC.SHN) and
 * closes it. `at_exit`: say so on stderr (see upnvme_fio_unload). */
static void ctrl_put_why(struct shared_ctrl *c, const char *at_exit)
{
	pthread_mutex_lock(&ctrls_lock);
	if (--c->refs == 0) {
		for (struct shared_ctrl **p = &ctrls; *p; p = &(*p)->next)
			if (*p == c) {
				*p = c->next;
				break;
			}
		int rc = upnvme_ctrl_close(c->ctrl);
		if (rc != UPNVME_OK)
			/* At exit the C API's per-thread message may be gone: the
			 * code's text always is there. */
			fprintf(stderr, "upnvme: closing %s: %s (%s)\n", c->addr,
				upnvme_strerror(rc), upnvme_last_error());
		else if (at_exit)
			fprintf(stderr, "upnvme: %s shut down and closed at exit (%s)\n", c->addr,
				at_exit);
		free(c);
	}
	pthread_mutex_unlock(&ctrls_lock);
}

static void ctrl_put(struct shared_ctrl *c)
{
	ctrl_put_why(c, NULL);
}

/* Undoes what a failed setup did: fio does not call cleanup for a job
 * whose setup failed, so the files it opened let go of their controllers
 * here (the last reference closes a controller). */
static void release_setup(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;

	for_each_file(td, f, i) {
		struct upnvme_fio_file *uf = f->engine_data;
		if (!uf || uf->owner != td)
			continue;
		pthread_mutex_lock(&ctrls_lock);
		for (struct upnvme_fio_file **p = &files_all; *p; p = &(*p)->next)
			if (*p == uf) {
				*p = uf->next;
				break;
			}
		pthread_mutex_unlock(&ctrls_lock);
		ctrl_put(uf->sc);
		free(uf);
		f->engine_data = NULL;
	}
}

static int open_files(struct thread_data *td);

/* Opens the controllers and sizes the files (before the threads start). */
static int upnvme_fio_setup(struct thread_data *td)
{
	int rc = open_files(td);
	if (rc != 0)
		release_setup(td);
	return rc;
}

static int open_files(struct thread_data *td)
{
	struct upnvme_fio_options *o = td->eo;
	struct fio_file *f;
	unsigned int i;

	if (!td->o.use_thread) {
		log_err("upnvme: set thread=1 (a controller cannot be shared across processes)\n");
		return 1;
	}
	for_each_file(td, f, i) {
		if (f->engine_data)
			continue;
		struct upnvme_fio_file *uf = calloc(1, sizeof(*uf));
		char addr[32];
		if (!uf)
			return 1;
		if (parse_filename(f->file_name, addr, sizeof(addr), &uf->nsid)) {
			free(uf);
			return 1;
		}
		int err = 0;
		uf->sc = ctrl_get(td, addr, &err);
		if (!uf->sc) {
			free(uf);
			td_verror(td, err, "upnvme_ctrl_open");
			return 1;
		}
		struct upnvme_ns_info info;
		int rc = upnvme_ns_get_info(uf->sc->ctrl, uf->nsid, &info);
		if (rc != UPNVME_OK) {
			ctrl_put(uf->sc);
			free(uf);
			return fail(td, "upnvme_ns_get_info", rc);
		}
		/* What would fail at every I/O is refused before the run. */
		struct upnvme_fio_file *first = td->files[0] ? td->files[0]->engine_data : NULL;
		const char *what = NULL, *why;
		uint32_t checks = 0;
		/* With protection information whose tuple is all of the
		 * metadata, PRACT keeps every byte of metadata on the device. */
		unsigned int tuple = info.pi_guard_bits == 16 ? 8 : 16;
		bool pi = info.pi_type != 0;
		bool pract_moves_none = pi && info.metadata_size == tuple;
		unsigned long long value = 0;
		unsigned int max_entries = upnvme_ctrl_max_queue_entries(uf->sc->ctrl);
		bool refuse = true;
		/* Where this job starts (offset=, offset_increment= and their
		 * percentages): fio's own rule, which reads the file's size. */
		f->real_file_size = info.size_bytes;
		unsigned long long start = get_start_offset(td, f);
		if (first && first->sc != uf->sc) {
			log_err("upnvme: '%s' is on another controller than '%s': the job's I/O memory "
				"is mapped for its first file's controller only; use one job per "
				"controller\n",
				f->file_name, td->files[0]->file_name);
		} else if (parse_pi_chk(o->pi_chk, &checks)) {
			/* Said above. */
		} else if (!pi && (o->pi_act || checks)) {
			log_err("upnvme: upnvme_pi_act / upnvme_pi_chk: namespace %u of '%s' has no "
				"protection information (PI type 0)\n",
				uf->nsid, f->file_name);
		} else if (info.metadata_size && !(pract_moves_none && o->pi_act)) {
			if (pract_moves_none)
				log_err("upnvme: namespace %u of '%s' has protection information (type "
					"%u, %u-byte tuple): set upnvme_pi_act=1, so that the controller "
					"generates and strips it (the engine passes no metadata buffers)\n",
					uf->nsid, f->file_name, info.pi_type, tuple);
			else
				log_err("upnvme: namespace %u of '%s' has %u metadata bytes per block: "
					"the fio engine moves no metadata (only a format whose metadata is "
					"the protection information tuple works, with upnvme_pi_act=1); "
					"format it without (upnvme format --ms 0 --lbaf N) or use another "
					"namespace\n",
					uf->nsid, f->file_name, info.metadata_size);
		} else if (pi && info.pi_type == 3 && (checks & UPNVME_PI_CHECK_REF_TAG)) {
			log_err("upnvme: upnvme_pi_chk=REFTAG: namespace %u of '%s' has protection "
				"information Type 3, which has no reference tag to check\n",
				uf->nsid, f->file_name);
		} else if (pi && info.pi_guard_bits == 32) {
			log_err("upnvme: namespace %u of '%s' has a 32-bit guard, for which the library "
				"builds no protection fields\n",
				uf->nsid, f->file_name);
		} else if (!sizes_fit_blocks(td, info.lba_size, &what, &value)) {
			log_err("upnvme: %s of %llu bytes is not a multiple of namespace %u's %u-byte "
				"blocks\n",
				what, value, uf->nsid, info.lba_size);
		} else if (start % info.lba_size) {
			log_err("upnvme: the job starts at byte %llu (offset= / offset_increment=), not "
				"a multiple of namespace %u's %u-byte blocks\n",
				start, uf->nsid, info.lba_size);
		} else if ((why = job_trims(td)) && !(uf->sc->oncs & UPNVME_ONCS_DSM)) {
			log_err("upnvme: the job trims (%s), and %s does not support Dataset "
				"Management (Identify Controller ONCS bit 2 is clear): every trim would "
				"fail; run a mode without trims on this controller\n",
				why, uf->sc->addr);
		} else if (o->entries && (o->entries < 2 || o->entries > max_entries)) {
			log_err("upnvme: upnvme_entries=%u: a queue pair of %s takes 2 to %u entries "
				"(CAP.MQES + 1); 0 (the default) sizes it for the iodepth\n",
				o->entries, uf->sc->addr, max_entries);
		} else if (td->o.pre_read) {
			log_err("upnvme: pre_read=1 reads the file through a file descriptor, and this "
				"engine has none (the namespace is reached through VFIO): leave it out\n");
		} else if (td->o.fsync_on_close) {
			log_err("upnvme: fsync_on_close=1 calls fsync() on a file descriptor, and this "
				"engine has none: use end_fsync=1 (a Flush through the engine at the "
				"job's end) or fsync=N\n");
		} else {
			refuse = false;
		}
		if (refuse) {
			ctrl_put(uf->sc);
			free(uf);
			return 1;
		}
		uf->lba_size = info.lba_size;
		uf->pi = (o->pi_act ? UPNVME_PI_PRACT : 0) | checks;
		uf->apptag = (uint16_t)o->apptag;
		uf->apptag_mask = (uint16_t)o->apptag_mask;
		uf->owner = td;
		f->real_file_size = info.size_bytes;
		f->filetype = FIO_TYPE_BLOCK;
		fio_file_set_size_known(f);
		f->engine_data = uf;
		pthread_mutex_lock(&ctrls_lock);
		uf->next = files_all;
		files_all = uf;
		pthread_mutex_unlock(&ctrls_lock);
	}
	return 0;
}

static int upnvme_fio_init(struct thread_data *td)
{
	struct upnvme_fio_thread *t = calloc(1, sizeof(*t));
	if (!t)
		return 1;
	t->max_events = td->o.iodepth;
	t->events = calloc(t->max_events, sizeof(*t->events));
	t->queued_ious = calloc(t->max_events, sizeof(*t->queued_ious));
	if (!t->events || !t->queued_ious) {
		free(t->events);
		free(t->queued_ious);
		free(t);
		return 1;
	}
	td->io_ops_data = t;
	/* The job runs: its files are its thread's to release now (see
	 * upnvme_fio_unload). */
	pthread_mutex_lock(&ctrls_lock);
	for (struct upnvme_fio_file *uf = files_all; uf; uf = uf->next)
		if (uf->owner == td)
			uf->started = 1;
	pthread_mutex_unlock(&ctrls_lock);
	return 0;
}

/* The queue pairs: one per file, made on the thread that uses them. */
static int upnvme_fio_open_file(struct thread_data *td, struct fio_file *f)
{
	struct upnvme_fio_options *o = td->eo;
	struct upnvme_fio_file *uf = f->engine_data;
	if (!uf)
		return 1;
	if (uf->qp)
		return 0;
	pthread_mutex_lock(&ctrls_lock);
	uf->started = 1;
	pthread_mutex_unlock(&ctrls_lock);
	struct upnvme_qpair_opts qo;
	upnvme_qpair_opts_default(&qo);
	qo.shadow_doorbells = o->shadow_doorbells != 0;
	qo.reap_on_submit = o->reap_on_submit != 0;
	qo.sq_announce_each_command = o->sq_announce_each != 0;
	qo.entries = o->entries;
	/* Queued io_us are announced by fio's commit (one SQ doorbell write for
	 * each iodepth_batch_submit batch), or by the next getevents. */
	qo.delay_doorbell = 1;
	/* A block size above MDTS goes as several commands (the library
	 * splits it): the pair must hold that many at once. */
	unsigned long long max_transfer = upnvme_ctrl_max_transfer(uf->sc->ctrl);
	unsigned long long max_rw = td->o.max_bs[DDIR_READ] > td->o.max_bs[DDIR_WRITE]
					    ? td->o.max_bs[DDIR_READ]
					    : td->o.max_bs[DDIR_WRITE];
	unsigned long long pieces = max_transfer ? (max_rw + max_transfer - 1) / max_transfer : 1;
	/* Without upnvme_entries, a pair that holds the whole iodepth when the
	 * library's default (min(256, CAP.MQES + 1 over 2) entries) would
	 * not: as many entries as that takes, at most the controller's
	 * CAP.MQES + 1 — fio then never sees the pair full, or as late as the
	 * controller allows. */
	unsigned long long want = (unsigned long long)td->o.iodepth * pieces + 1;
	unsigned int limit = upnvme_ctrl_max_queue_entries(uf->sc->ctrl);
	unsigned int dflt = limit / 2 < 256 ? limit / 2 : 256;
	if (!o->entries && want > dflt)
		qo.entries = want < limit ? (unsigned int)want : limit;
	int rc = upnvme_qpair_create(uf->sc->ctrl, &qo, &uf->qp);
	if (rc != UPNVME_OK)
		return fail(td, "upnvme_qpair_create", rc);
	unsigned int depth = upnvme_qpair_max_depth(uf->qp);
	if (pieces > depth) {
		log_err("upnvme: block size %llu goes as %llu commands of at most %llu bytes (MDTS), "
			"more than the queue pair holds (%u): use upnvme_entries=%llu or more, or a "
			"smaller bs\n",
			max_rw, pieces, max_transfer, depth, pieces + 1);
		upnvme_qpair_destroy(uf->qp);
		uf->qp = NULL;
		td_verror(td, EINVAL, "upnvme_open_file");
		return 1;
	}
	if (depth < td->o.iodepth * pieces) {
		if (td_rw(td) && td->o.verify != VERIFY_NONE) {
			/* fio draws a new verify seed for a write it requeues after
			 * FIO_Q_BUSY, and a mixed job's verify pass replays the
			 * seeds in order: every block after the first busy write
			 * would fail to verify although its data is right. */
			if (want <= limit)
				log_err("upnvme: queue pair holds %u commands, less than iodepth %u x "
					"%llu command(s) per I/O: a mixed read/write job with verify "
					"would report false mismatches when the pair is full; use a "
					"lower iodepth or upnvme_entries=%llu\n",
					depth, td->o.iodepth, pieces, want);
			else
				log_err("upnvme: queue pair holds %u commands, less than iodepth %u x "
					"%llu command(s) per I/O: a mixed read/write job with verify "
					"would report false mismatches when the pair is full, and the "
					"controller's queues take at most %u entries (CAP.MQES + 1): "
					"use iodepth=%llu or less\n",
					depth, td->o.iodepth, pieces, limit, (limit - 1) / pieces);
			upnvme_qpair_destroy(uf->qp);
			uf->qp = NULL;
			td_verror(td, EINVAL, "upnvme_open_file");
			return 1;
		}
		log_info("upnvme: queue pair holds %u commands, iodepth %u x %llu command(s) per I/O "
			 "is more: fio waits when full\n",
			 depth, td->o.iodepth, pieces);
	}
	return 0;
}

static int upnvme_fio_close_file(struct thread_data *td, struct fio_file *f)
{
	struct upnvme_fio_file *uf = f->engine_data;
	if (uf && uf->qp) {
		int rc = upnvme_qpair_destroy(uf->qp);
		if (rc != UPNVME_OK)
			return fail(td, "upnvme_qpair_destroy", rc);
		uf->qp = NULL;
	}
	return 0;
}

static int upnvme_fio_iomem_alloc(struct thread_data *td, size_t total)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	struct fio_file *f = td->files[0];
	struct upnvme_fio_file *uf = f ? f->engine_data : NULL;
	if (!t || !uf) {
		/* The DMA memory comes from the controller of the job's first
		 * file, set up before fio allocates I/O memory only when the job
		 * names its files (--filename) and sets them up serially. */
		log_err("upnvme: fio allocates its I/O memory before the job's controller is open: "
			"give the job --filename=traddr=... (iolog or blktrace replay without it, and "
			"create_serialize=0, are not supported)\n");
		td_verror(td, EINVAL, "upnvme_iomem_alloc");
		return 1;
	}
	int rc = upnvme_buf_alloc(uf->sc->ctrl, total, &t->mem);
	if (rc != UPNVME_OK)
		return fail(td, "upnvme_buf_alloc (fio's I/O memory)", rc);
	t->mem_base = upnvme_buf_data(t->mem);
	td->orig_buffer = t->mem_base;
	return 0;
}

static void upnvme_fio_iomem_free(struct thread_data *td)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	if (!t)
		return;
	for (size_t i = 0; i < t->nr_pieces; i++)
		upnvme_buf_free(t->pieces[i]);
	free(t->pieces);
	t->pieces = NULL;
	t->nr_pieces = 0;
	upnvme_buf_free(t->mem);
	t->mem = NULL;
	td->orig_buffer = NULL;
	/* The io_us may be freed already (fio frees them first at cleanup):
	 * their pieces are marked stale by the generation, not touched. */
	t->gen++;
}

static int upnvme_fio_io_u_init(struct thread_data *td, struct io_u *io_u)
{
	struct upnvme_fio_iou *u = calloc(1, sizeof(*u));
	if (!u)
		return 1;
	u->t = td->io_ops_data;
	u->io_u = io_u;
	io_u->engine_data = u;
	return 0;
}

static void upnvme_fio_io_u_free(struct thread_data *td, struct io_u *io_u)
{
	free(io_u->engine_data);
	io_u->engine_data = NULL;
}

/* After fio placed each io_u's buffer in the I/O memory: split it into one
 * piece per io_u (each a DMA buffer its commands own while in flight). Run
 * from post_init, and again from queue after fio allocated its I/O memory
 * anew (see `gen`). */
static int split_io_mem(struct thread_data *td)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	/* The spacing fio gave the io_u buffers: max_bs up to fio 3.41; later
	 * fio spaces them by the largest read/write size unless the job's
	 * trims need the room (td_max_rw_bs), so it is read off the buffers
	 * themselves, which fio lays out one after the other. */
	size_t piece = td_max_bs(td);
	if (td->io_u_all.nr >= 2) {
		char *a = td->io_u_all.io_us[0]->buf, *b = td->io_u_all.io_us[1]->buf;
		if (b > a)
			piece = (size_t)(b - a);
	}
	size_t len = upnvme_buf_len(t->mem);
	size_t n = (len + piece - 1) / piece;
	t->pieces = calloc(n, sizeof(*t->pieces));
	if (!t->pieces) {
		td_verror(td, ENOMEM, "upnvme_split_io_mem");
		return 1;
	}
	for (int i = 0; i < td->io_u_all.nr; i++) {
		struct io_u *io_u = td->io_u_all.io_us[i];
		size_t off = (size_t)((char *)io_u->buf - t->mem_base);
		if (off % piece) {
			log_err("upnvme: io_u buffer at offset %zu is not a multiple of the buffers' "
				"spacing %zu (mem_align is not supported)\n", off, piece);
			td_verror(td, EINVAL, "mem_align");
			return 1;
		}
	}
	int rc = upnvme_buf_split(t->mem, piece, t->pieces, n, &t->nr_pieces);
	if (rc != UPNVME_OK)
		return fail(td, "upnvme_buf_split", rc);
	t->mem = NULL; /* consumed */
	t->piece_len = piece;
	t->gen++;
	for (int i = 0; i < td->io_u_all.nr; i++) {
		struct io_u *io_u = td->io_u_all.io_us[i];
		struct upnvme_fio_iou *u = io_u->engine_data;
		u->piece = t->pieces[((char *)io_u->buf - t->mem_base) / piece];
		u->gen = t->gen;
	}
	return 0;
}

static int upnvme_fio_post_init(struct thread_data *td)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	if (!t->mem) {
		if (td_read(td) || td_write(td)) {
			/* fio goes on when its I/O memory could not be allocated
			 * (iomem_alloc said why), with NULL buffers it would write
			 * through: stop the job here. */
			log_err("upnvme: the job moves data but has no I/O memory (its allocation "
				"failed, see above)\n");
			td_verror(td, ENOMEM, "upnvme_post_init");
			return 1;
		}
		return 0; /* no data transfer (trim only) */
	}
	return split_io_mem(td);
}

static void upnvme_fio_done(void *arg, const struct upnvme_cpl *cpl)
{
	struct upnvme_fio_iou *u = arg;
	struct io_u *io_u = u->io_u;
	if (cpl->status == UPNVME_OK) {
		io_u->error = 0;
	} else {
		io_u->error = errno_of(cpl->status);
		if (cpl->status == UPNVME_EIO)
			log_err("upnvme: %s at offset %llu failed: NVMe status sct %u sc %#x\n",
				io_ddir_name(io_u->ddir), (unsigned long long)io_u->offset, cpl->sct,
				cpl->sc);
	}
	struct upnvme_fio_thread *t = u->t;
	if (t->nr_events < t->max_events)
		t->events[t->nr_events++] = io_u;
}

static enum fio_q_status upnvme_fio_queue(struct thread_data *td, struct io_u *io_u)
{
	struct upnvme_fio_file *uf = io_u->file->engine_data;
	struct upnvme_fio_iou *u = io_u->engine_data;
	uint64_t slba = io_u->offset / uf->lba_size;
	uint64_t blocks = io_u->xfer_buflen / uf->lba_size;
	int rc;

	fio_ro_check(td, io_u);
	if (io_u->offset % uf->lba_size || io_u->xfer_buflen % uf->lba_size || blocks > UINT32_MAX) {
		log_err("upnvme: offset %llu / length %llu are not multiples of the LBA size %u\n",
			(unsigned long long)io_u->offset, (unsigned long long)io_u->xfer_buflen,
			uf->lba_size);
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	switch (io_u->ddir) {
	case DDIR_READ:
	case DDIR_WRITE:
		if (u->gen != u->t->gen && u->t->mem && split_io_mem(td) != 0) {
			io_u->error = EINVAL;
			return FIO_Q_COMPLETED;
		}
		if (u->gen != u->t->gen || !u->piece ||
		    io_u->xfer_buf != upnvme_buf_data(u->piece)) {
			log_err("upnvme: the io_u's data is not at the start of its DMA piece\n");
			io_u->error = EINVAL;
			return FIO_Q_COMPLETED;
		}
		/* sync=1 / sync=dsync (O_SYNC / O_DSYNC): each write is durable
		 * when it completes — Force Unit Access, as the kernel does for
		 * such writes to a block device. */
		if (uf->pi) {
			struct upnvme_io_ext ext = {
				.size = sizeof(ext),
				.flags = io_u->ddir == DDIR_WRITE && td->o.sync_io ? UPNVME_IO_FUA : 0,
				.pi = uf->pi,
				.app_tag = uf->apptag,
				.app_tag_mask = uf->apptag_mask,
			};
			rc = io_u->ddir == DDIR_READ
				     ? upnvme_read_ext(uf->qp, uf->nsid, u->piece, slba,
						       (uint32_t)blocks, &ext, upnvme_fio_done, u)
				     : upnvme_write_ext(uf->qp, uf->nsid, u->piece, slba,
							(uint32_t)blocks, &ext, upnvme_fio_done, u);
			break;
		}
		rc = io_u->ddir == DDIR_READ
			     ? upnvme_read(uf->qp, uf->nsid, u->piece, slba, (uint32_t)blocks,
					   upnvme_fio_done, u)
			     : upnvme_write_flags(uf->qp, uf->nsid, u->piece, slba, (uint32_t)blocks,
						  td->o.sync_io ? UPNVME_IO_FUA : 0, upnvme_fio_done, u);
		break;
	case DDIR_TRIM: {
		struct upnvme_range r = {.slba = slba, .blocks = (uint32_t)blocks};
		rc = upnvme_deallocate(uf->qp, uf->nsid, &r, 1, upnvme_fio_done, u);
		break;
	}
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		/* A Flush covers the writes completed before it is submitted
		 * (NVM Command Set, Flush): wait for those in flight, as fsync
		 * after them would (fio reaps on FIO_Q_BUSY and asks again). */
		if (upnvme_qpair_in_flight(uf->qp) > 0) {
			/* Unless reaping failed: they may never complete, and
			 * fio's end_fsync and pre-verify sync ask again after
			 * "busy" without reaping — it would spin for ever. */
			if (uf->poll_rc) {
				log_err("upnvme: %s: %u command(s) in flight that may never "
					"complete (%s)\n",
					io_ddir_name(io_u->ddir), upnvme_qpair_in_flight(uf->qp),
					upnvme_strerror(uf->poll_rc));
				io_u->error = errno_of(uf->poll_rc);
				return FIO_Q_COMPLETED;
			}
			return FIO_Q_BUSY;
		}
		rc = upnvme_flush(uf->qp, uf->nsid, upnvme_fio_done, u);
		break;
	default:
		log_err("upnvme: %s is not an I/O this engine does\n", io_ddir_name(io_u->ddir));
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	if (rc == UPNVME_EAGAIN)
		return FIO_Q_BUSY;
	if (rc != UPNVME_OK) {
		log_err("upnvme: %s: %s\n", io_ddir_name(io_u->ddir), upnvme_last_error());
		io_u->error = errno_of(rc);
		return FIO_Q_COMPLETED;
	}
	if (u->t->queued < u->t->max_events)
		u->t->queued_ious[u->t->queued] = io_u;
	u->t->queued++;
	return FIO_Q_QUEUED;
}

/* fio's commit, after each batch it queued (iodepth_batch_submit io_us,
 * and before it waits for completions): one SQ doorbell write per queue
 * pair announces them all (the pairs delay their doorbell). */
static int upnvme_fio_commit(struct thread_data *td)
{
	struct fio_file *f;
	unsigned int i;

	for_each_file(td, f, i) {
		struct upnvme_fio_file *uf = f->engine_data;
		if (!uf || !uf->qp)
			continue;
		int rc = upnvme_qpair_ring(uf->qp);
		if (rc != UPNVME_OK) {
			log_err("upnvme: ring: %s\n", upnvme_last_error());
			return -errno_of(rc);
		}
	}
	struct upnvme_fio_thread *t = td->io_ops_data;
	if (t->queued) {
		/* An engine with a commit hook counts its own submissions and
		 * reports them as queued (submission latency); they were
		 * issued when the doorbell above announced them. */
		if (fio_fill_issue_time(td)) {
			struct timespec now;
			fio_gettime(&now, NULL);
			for (unsigned int i = 0; i < t->queued && i < t->max_events; i++) {
				memcpy(&t->queued_ious[i]->issue_time, &now, sizeof(now));
				io_u_queued(td, t->queued_ious[i]);
			}
			if (td->o.read_iolog_file)
				memcpy(&td->last_issue, &now, sizeof(now));
		}
		io_u_mark_submit(td, t->queued);
		t->queued = 0;
	}
	return 0;
}

static int upnvme_fio_getevents(struct thread_data *td, unsigned int min, unsigned int max,
				const struct timespec *timeout)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	struct timespec start;
	struct fio_file *f;

	t->nr_events = 0;
	if (max > t->max_events)
		max = t->max_events;
	/* fio reaps without committing first when it does not wait (min 0):
	 * announce what it queued, with its statistics, before anything of
	 * it can complete. */
	if (t->queued) {
		int rc = upnvme_fio_commit(td);
		if (rc < 0)
			return rc;
	}
	if (timeout)
		fio_gettime(&start, NULL);
	unsigned int nr_files = td->o.nr_files;
	unsigned int from = nr_files ? t->poll_from % nr_files : 0;
	t->poll_from = from + 1;
	for (;;) {
		for (unsigned int k = 0; k < nr_files; k++) {
			f = td->files[(from + k) % nr_files];
			struct upnvme_fio_file *uf = f ? f->engine_data : NULL;
			if (!uf || !uf->qp || t->nr_events >= max)
				continue;
			int rc = upnvme_qpair_process_completions(uf->qp, max - t->nr_events);
			uf->poll_rc = rc < 0 ? rc : 0;
			if (rc < 0) {
				log_err("upnvme: process_completions: %s\n", upnvme_last_error());
				/* The io_us collected so far completed: hand them to
				 * fio; the error comes back at the next call. */
				return t->nr_events > 0 ? (int)t->nr_events : -errno_of(rc);
			}
		}
		if (t->nr_events >= min)
			break;
		if (timeout) {
			uint64_t us = utime_since_now(&start);
			if (us >= (uint64_t)timeout->tv_sec * 1000000 + timeout->tv_nsec / 1000)
				break;
		}
	}
	return (int)t->nr_events;
}

static struct io_u *upnvme_fio_event(struct thread_data *td, int event)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	return t->events[event];
}

typedef int (*file_pick)(const struct upnvme_fio_file *uf, const void *arg);

/* Takes the files for which `pick(uf, arg)` holds off files_all (under
 * ctrls_lock) and returns them as a list of their own. */
static struct upnvme_fio_file *unlink_files(file_pick pick, const void *arg)
{
	struct upnvme_fio_file *taken = NULL;

	pthread_mutex_lock(&ctrls_lock);
	for (struct upnvme_fio_file **p = &files_all; *p;) {
		struct upnvme_fio_file *uf = *p;
		if (pick(uf, arg)) {
			*p = uf->next;
			uf->next = taken;
			taken = uf;
		} else {
			p = &uf->next;
		}
	}
	pthread_mutex_unlock(&ctrls_lock);
	return taken;
}

static int owned_by(const struct upnvme_fio_file *uf, const void *td)
{
	return uf->owner == td;
}

static int never_started(const struct upnvme_fio_file *uf, const void *unused)
{
	(void)unused;
	return !uf->started;
}

static void upnvme_fio_cleanup(struct thread_data *td)
{
	struct upnvme_fio_thread *t = td->io_ops_data;
	struct upnvme_fio_file *mine = unlink_files(owned_by, td);

	while (mine) {
		struct upnvme_fio_file *uf = mine;
		mine = uf->next;
		if (uf->qp && upnvme_qpair_destroy(uf->qp) != UPNVME_OK)
			log_err("upnvme: destroying a queue pair: %s\n", upnvme_last_error());
		ctrl_put(uf->sc);
		free(uf);
	}
	if (t) {
		free(t->events);
		free(t->queued_ious);
		free(t);
		td->io_ops_data = NULL;
	}
}

/* When fio exits (or unloads the engine). A job whose setup opened its files
 * but whose thread never started -- ended before its turn by exitall, by an
 * interrupt, or by another job's error -- gets no cleanup call, so its
 * references would keep its controller open: the process would end without
 * the controller's shutdown (CC.SHN), which tells it to make its volatile
 * write cache and metadata durable. Those references are dropped here. A file
 * whose job's thread did start (`started`, set by init and open_file) and did
 * not clean up -- fio gave up on a stuck job -- is left alone: its thread may
 * still be inside the C API, and its controller is not shut down under it.
 *
 * By now glibc has run this thread's thread-local destructors; the C API's
 * error slot is read with `try_with` on the Rust side, so the calls below
 * stay defined. */
__attribute__((destructor)) static void upnvme_fio_unload(void)
{
	struct upnvme_fio_file *unstarted = unlink_files(never_started, NULL);

	while (unstarted) {
		struct upnvme_fio_file *uf = unstarted;
		unstarted = uf->next;
		ctrl_put_why(uf->sc, "a job set up on it never started");
		free(uf);
	}
}

static int upnvme_fio_invalidate(struct thread_data *td, struct fio_file *f)
{
	return 0; /* no page cache */
}

struct ioengine_ops ioengine = {
	.name = "upnvme",
	.version = FIO_IOOPS_VERSION,
	/* FIO_NO_OFFLOAD: io_submit_mode=offload would submit from fio's
	 * worker threads onto this thread's queue pairs (one thread per pair). */
	/* FIO_ASYNCIO_SETS_ISSUE_TIME: the commit stamps each io_u when its
	 * doorbell announces it (fio would stamp it again after queue). */
	.flags = FIO_RAWIO | FIO_NOEXTEND | FIO_NODISKUTIL | FIO_MEMALIGN | FIO_DISKLESSIO |
		 FIO_NO_OFFLOAD | FIO_ASYNCIO_SETS_ISSUE_TIME,
	.setup = upnvme_fio_setup,
	.init = upnvme_fio_init,
	.post_init = upnvme_fio_post_init,
	.queue = upnvme_fio_queue,
	.commit = upnvme_fio_commit,
	.getevents = upnvme_fio_getevents,
	.event = upnvme_fio_event,
	.cleanup = upnvme_fio_cleanup,
	.open_file = upnvme_fio_open_file,
	.close_file = upnvme_fio_close_file,
	.invalidate = upnvme_fio_invalidate,
	.iomem_alloc = upnvme_fio_iomem_alloc,
	.iomem_free = upnvme_fio_iomem_free,
	.io_u_init = upnvme_fio_io_u_init,
	.io_u_free = upnvme_fio_io_u_free,
	.option_struct_size = sizeof(struct upnvme_fio_options),
	.options = options,
};
