/*
 * dspkd's configuration parser (daemon/config.c over libinih): the input is
 * the file, handed to dspkd_config_start through a memfd, after the
 * defaults.  Oracles: an accepted file leaves every limit inside the range
 * the key table allows; a refused one is refused with a line on stderr
 * (silenced here) and a documented code.
 */
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "dspk/errors.h"
#include "tests/fuzz/fuzz_common.h"

static int memfd = -1;
static FILE *devnull;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct dspkd_config cfg;
  char path[64];
  char *argv[4];
  int r;

  if (memfd < 0) {
    memfd = memfd_create("dspkd.conf", MFD_CLOEXEC);
    FUZZ_CHECK(memfd >= 0);
    /* A memfd is made mode 0777: dspkd refuses a configuration file that
     * group or others could write (dspk.conf(5)), so the harness makes it
     * one it accepts, or no input would reach the parser. */
    FUZZ_CHECK(fchmod(memfd, 0600) == 0);
    dspkd_log_set_level(DSPKD_ERROR);
    /* The parser's error lines go to stdio's stderr: send those to
     * /dev/null; file descriptor 2 stays, for libFuzzer and the sanitizers. */
    devnull = fopen("/dev/null", "w");
    FUZZ_CHECK(devnull != NULL);
    stderr = devnull;
  }
  FUZZ_CHECK(ftruncate(memfd, 0) == 0);
  FUZZ_CHECK(pwrite(memfd, data, size, 0) == (ssize_t)size);
  snprintf(path, sizeof path, "/proc/self/fd/%d", memfd);
  argv[0] = "dspkd";
  argv[1] = "--config";
  argv[2] = path;
  argv[3] = NULL;
  dspkd_config_defaults(&cfg);
  r = dspkd_config_start(3, argv, &cfg);
  FUZZ_CHECK(r == 0 || r == DSPK_EINVAL || r == DSPK_EIO || r == DSPK_ENOENT);
  if (r == 0) {
    FUZZ_CHECK(cfg.lim.max_message >= 64 && cfg.lim.max_message <= (size_t)1 << 32);
    FUZZ_CHECK(cfg.lim.max_depth >= 4 && cfg.lim.max_depth <= 1024);
    FUZZ_CHECK(cfg.lim.max_rank >= 1 && cfg.lim.max_rank <= DSPK_MAX_RANK);
    FUZZ_CHECK(cfg.lim.max_elements >= 1 && cfg.lim.max_elements <= (uint64_t)1 << 40);
    FUZZ_CHECK(cfg.max_inflight >= 1 && cfg.max_buffers >= 1 && cfg.max_clients >= 1);
    /* Derived when the file leaves it unset (a quarter of max_clients). */
    FUZZ_CHECK(cfg.max_user_clients >= 1);
    FUZZ_CHECK(cfg.log_level >= DSPKD_ERROR && cfg.log_level <= DSPKD_DEBUG);
    FUZZ_CHECK(cfg.allow_users.n <= DSPKD_MAX_IDS && cfg.allow_groups.n <= DSPKD_MAX_IDS);
    (void)dspkd_policy_may_connect(&cfg, 1000, 1000, NULL, 0);
    (void)dspkd_policy_is_admin(&cfg, 1000, 1000, NULL, 0);
  }
  return 0;
}
