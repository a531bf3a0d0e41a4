/*
 * Access policy and admin methods (daemon/admin.h).  The peer's identity is
 * what the kernel recorded when it connected: SO_PEERCRED (uid, gid, kept
 * on the connection by daemon/conn.c) and SO_PEERGROUPS (its supplementary
 * groups, read here when a decision needs them).  Each decision uses the
 * policy in force at that moment, so a reload applies to the next request;
 * a reload also closes the connections whose peers the new allow lists no
 * longer admit (dspkd_admin_reloaded), as they would be refused now.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/lifecycle.h"
#include "daemon/log.h"

#define MAX_GROUPS 256

/* Reads the peer's supplementary groups; returns how many (0 when the
 * kernel cannot tell). */
static size_t peer_groups(struct conn *c, gid_t *groups, size_t max) {
  uv_os_fd_t fd;
  socklen_t len = (socklen_t)(max * sizeof *groups);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0)
    return 0;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0)
    return 0;
  return len / sizeof *groups;
}

int dspkd_admin_may_connect(struct conn *c) {
  const struct dspkd_config *cfg = &c->d->cfg;
  gid_t groups[MAX_GROUPS];
  size_t n;

  if (!cfg->allow_users.n && !cfg->allow_groups.n)
    return 1;
  if (c->uid == (uid_t)-1)
    return 0;
  n = peer_groups(c, groups, MAX_GROUPS);
  return dspkd_policy_may_connect(cfg, c->uid, c->gid, groups, n);
}

int dspkd_admin_is(struct conn *c) {
  gid_t groups[MAX_GROUPS];
  size_t n;
  if (c->uid == (uid_t)-1)
    return 0;
  n = peer_groups(c, groups, MAX_GROUPS);
  return dspkd_policy_is_admin(&c->d->cfg, c->uid, c->gid, groups, n);
}

bool dspkd_sees_uid(const struct conn *caller, bool admin, uint32_t uid) {
  return admin || (caller->uid != (uid_t)-1 && uid != (uint32_t)-1 &&
                   (uint32_t)caller->uid == uid);
}

/* dspkd_devices_shown (admin_wide: an admin outside any job is shown
 * every device) and dspkd_devices_usable (not). */
static struct djob *devices_for(struct conn *c, bool admin_wide, bool *shown) {
  struct dspkd *d = c->d;
  struct djob *j = c->job;
  bool decided = c->job_state != 0;
  char ignored[8];

  /* A uid with several jobs here and no claim may use the cpu only. */
  if (!decided)
    decided = dspkd_job_decide(c, &j, ignored, sizeof ignored) == 0;
  for (int i = 0; i < d->ndevs; i++)
    shown[i] = d->devs[i].open_state == 1 &&
               ((admin_wide && !j) || dspkd_job_dev_allowed(d, j, decided, &d->devs[i]));
  return j;
}

struct djob *dspkd_devices_shown(struct conn *c, bool admin, bool *shown) {
  return devices_for(c, admin, shown);
}

struct djob *dspkd_devices_usable(struct conn *c, bool *usable) {
  return devices_for(c, false, usable);
}

/* Answers method's one-field result (reloaded, stopping): yes.  0 or a
 * negative code. */
static int reply_bool(struct req *r, int method, bool yes) {
  struct dspk__pval v[1] = {dspk__pv_bool(yes)};
  struct wreq *wr = dspkd_result(r->msgid, method, v);
  if (!wr)
    return DSPK_ENOMEM;
  dspkd_conn_send(r->c, wr);
  return 0;
}

int dspkd_admin_refuse(struct req *r, const char *method) {
  struct conn *c = r->c;
  /* The notice is the refusal's line; when the per-uid limit holds it
   * back, the generic debug line of conn.c is left to say it. */
  if (dspkd_log_client_ok((long)c->uid, DSPKD_NOTICE)) {
    dspkd_notice(DSPKD_PEER_FMT ": %s refused: not an admin", DSPKD_PEER_ARGS(c), method);
    r->logged = true;
  }
  /* Every admin refusal names the whole rule (docs/protocol.md): root and
   * the daemon's own user are admins whatever the lists say. */
  return dspk__fail(r->msg, sizeof r->msg, DSPK_EPERM, "%s: permission denied: uid %ld is "
                    "not an admin (root, the daemon's own user (uid %ld), admin_users and "
                    "admin_groups in the [policy] of dspkd.conf)", method, (long)c->uid,
                    (long)geteuid());
}

int dspkd_admin_check(struct req *r, const char *method) {
  if (dspkd_admin_is(r->c))
    return 0;
  return dspkd_admin_refuse(r, method);
}

void dspkd_admin_connect_refusal(const struct conn *c, char *msg, size_t len) {
  snprintf(msg, len, "permission denied: uid %ld may not connect (root, the daemon's own "
           "user (uid %ld), allow_users and allow_groups in the [policy] of dspkd.conf)",
           (long)c->uid, (long)geteuid());
}

size_t dspkd_admin_reloaded(struct dspkd *d) {
  char msg[192];
  size_t n = 0;

  for (struct conn *c = d->conns; c; c = c->next) {
    if (c->closing || dspkd_admin_may_connect(c))
      continue;
    /* The refusal a new connection of this peer gets now. */
    dspkd_admin_connect_refusal(c, msg, sizeof msg);
    dspkd_conn_close_notice(c, DSPK_EPERM, msg);
    n++;
  }
  if (n)
    dspkd_info("reload: %zu connection(s) closed: allow_users and allow_groups no longer "
               "admit their users", n);
  /* A trace begun as an admin by a peer that is one no longer (the
   * connections above are closed: their traces end with them). */
  dspkd_trace_reloaded(d);
  return n;
}

int dspkd_m_daemon_reload(struct req *r) {
  struct conn *c = r->c;
  int err;
  dspkd_info(DSPKD_PEER_FMT ": daemon.reload", DSPKD_PEER_ARGS(c));
  err = dspkd_reload(c->d, r->msg, sizeof r->msg);
  /* Every refusal, whatever its code, was logged as the one
   * "reload: ...; keeping the running configuration" line at err
   * (dspkd_config_reload), as for SIGHUP: the answer tells the rest. */
  r->logged = err < 0;
  if (err < 0)
    return err;
  /* false: no file was read (--config "", or the default file that does
   * not exist and never did): nothing changed. */
  return reply_bool(r, DSPK__M_DAEMON_RELOAD, err == 0);
}

int dspkd_m_daemon_stop(struct req *r) {
  struct conn *c = r->c;
  int err;
  dspkd_info(DSPKD_PEER_FMT ": daemon.stop", DSPKD_PEER_ARGS(c));
  err = reply_bool(r, DSPK__M_DAEMON_STOP, true);
  if (err < 0)
    return err;
  dspkd_stop(c->d);
  return 0;
}
