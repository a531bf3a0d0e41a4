/*
 * Slurm jobs (docs/cluster.md; docs/protocol.md, "Slurm jobs"): which job
 * each connection belongs to, and the devices it may therefore use.
 *
 * The prolog of a job registers it (job.register, an admin method): its id,
 * the uid it runs as and the UUIDs of the GPUs Slurm gave it on this node.
 * A connection's job is decided once, at its first request that needs a
 * device (devices, buffer.create, task.run), from, in this order:
 *   1. the peer's cgroup (/proc/PID/cgroup), the line of the hierarchy
 *      Slurm's proctrack/cgroup uses alone (v1's freezer, else v2's "0::"):
 *      it puts a job's processes under a path with ".../job_<id>/...";
 *   2. the job the client claimed in hello (libdspkclient and the Python
 *      client send SLURM_JOB_ID);
 *   3. without either: the uid's only registered job on this node.
 * A job named by 1 or 2 must be registered for the peer's uid; one of its
 * own that ended on this node is EPERM, and so is a job that is not its own
 * (registered for another uid, ended, or never registered) while the uid
 * has registered jobs here (a process cannot step out of its allocation by
 * naming a job that does not exist or is another's).  A uid with several
 * jobs here and no claim is EPERM until it names one.  A uid without
 * registered jobs has no job: every device (as on a host without Slurm),
 * unless job_required is set (then the cpu only), whatever job it names.
 *
 * Another user's jobs are not shown to a non-admin (status, metrics), so
 * neither is the answer to a claim: naming another user's job (registered or
 * ended) is answered exactly as naming a job not registered here, the same
 * outcome and the same message, so that a loop over job ids lists nothing.
 * An admin, who sees every job anyway, is told that the job is another
 * user's or has ended (EPERM).
 *
 * A connection of a job sees and uses the cpu devices and the devices whose
 * UUID is in the job's allocation; the same GPU through two backends has one
 * UUID, so it is allowed (or not) under both.  job.end closes the job's
 * connections (queued work dropped, running tasks canceled, buffers freed)
 * and answers once the last of them is gone.
 * Loop thread only.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/admin.h"
#include "daemon/dspkd.h"
#include "daemon/lifecycle.h"
#include "daemon/log.h"
#include "proto/units.h"

#define MAX_JOBS 4096

int dspkd_uuid_norm(const char *in, size_t len, char out[DSPKD_UUID_LEN]) {
  size_t n = 0;
  for (size_t i = 0; i < len && in[i]; i++) {
    if (!isxdigit((unsigned char)in[i]))
      continue;
    if (n + 1 >= DSPKD_UUID_LEN)
      return -1;
    out[n++] = (char)tolower((unsigned char)in[i]);
  }
  out[n] = '\0';
  return n ? 0 : -1;
}

/* A UUID as job.register takes it: proto/units.c's dspk__uuid_parse, the
 * rule dspk-submit checks --devices by. */
_Static_assert(DSPKD_UUID_LEN == DSPK__UUID_LEN, "one UUID length");

static struct djob *job_find(struct dspkd *d, uint64_t id) {
  for (struct djob *j = d->jobs; j; j = j->next)
    if (j->id == id && !j->ended)
      return j;
  return NULL;
}

/* Job id when a job.end of it waits for its connections (NULL: none). */
static struct djob *job_ending(struct dspkd *d, uint64_t id) {
  for (struct djob *j = d->jobs; j; j = j->next)
    if (j->id == id && j->ended)
      return j;
  return NULL;
}

/* Adds r to the job.end calls that job j's end answers. */
/* Room for one more job.end on job j, made before anything changes (a
 * job ended without its caller on the list would never answer it). */
static int job_end_room(struct djob *j) {
  struct jend_wait *w = realloc(j->ends, (j->nends + 1) * sizeof *w);
  if (!w)
    return DSPK_ENOMEM;
  j->ends = w;
  return 0;
}

static int job_end_wait(struct req *r, struct djob *j) {
  int err = job_end_room(j);
  if (err < 0)
    return err;
  j->ends[j->nends++] = (struct jend_wait){r->c, r->msgid};
  dspkd_conn_owe(r->c);
  return 0;
}

bool dspkd_job_was_ended(const struct dspkd *d, uint64_t id, uid_t *uid) {
  for (unsigned i = 0; i < d->nended; i++)
    if (d->ended_jobs[i] == id) {
      if (uid)
        *uid = d->ended_uids[i];
      return true;
    }
  return false;
}

/* Puts (id, uid) at position at of d's ended list, the younger ones moved
 * up; the list has room. */
static void ended_insert(struct dspkd *d, unsigned at, uint64_t id, uid_t uid) {
  memmove(&d->ended_jobs[at + 1], &d->ended_jobs[at],
          (d->nended - at) * sizeof d->ended_jobs[0]);
  memmove(&d->ended_uids[at + 1], &d->ended_uids[at],
          (d->nended - at) * sizeof d->ended_uids[0]);
  d->ended_jobs[at] = id;
  d->ended_uids[at] = uid;
  d->nended++;
}

/* Takes position at out of d's ended list, the younger ones moved down. */
static void ended_remove(struct dspkd *d, unsigned at) {
  d->nended--;
  memmove(&d->ended_jobs[at], &d->ended_jobs[at + 1],
          (d->nended - at) * sizeof d->ended_jobs[0]);
  memmove(&d->ended_uids[at], &d->ended_uids[at + 1],
          (d->nended - at) * sizeof d->ended_uids[0]);
}

bool dspkd_job_end_record(struct dspkd *d, uint64_t id, uid_t uid,
                          struct dspkd_ended_undo *undo) {
  struct dspkd_ended_undo u = {0};
  if (!dspkd_job_was_ended(d, id, NULL)) {
    u.recorded = true;
    if (d->nended == DSPKD_ENDED_SLOTS) {
      u.dropped = true;
      u.id = d->ended_jobs[0];
      u.uid = d->ended_uids[0];
      ended_remove(d, 0);
    }
    ended_insert(d, d->nended, id, uid);
  }
  if (undo)
    *undo = u;
  return u.recorded;
}

void dspkd_job_end_unrecord(struct dspkd *d, const struct dspkd_ended_undo *undo) {
  if (!undo->recorded)
    return;
  ended_remove(d, d->nended - 1);
  if (undo->dropped)
    ended_insert(d, 0, undo->id, undo->uid);
}

/* A job registered again (a requeued one) leaves d's ended list: it may be
 * claimed again.  *undo says where it was (recorded false: it was not
 * there), for ended_unforget. */
static void ended_forget(struct dspkd *d, uint64_t id, struct dspkd_ended_undo *undo) {
  *undo = (struct dspkd_ended_undo){0};
  for (unsigned i = 0; i < d->nended; i++)
    if (d->ended_jobs[i] == id) {
      *undo = (struct dspkd_ended_undo){.recorded = true, .at = i, .id = id,
                                        .uid = d->ended_uids[i]};
      ended_remove(d, i);
      return;
    }
}

/* Puts back what ended_forget took (nothing else changed the list since). */
static void ended_unforget(struct dspkd *d, const struct dspkd_ended_undo *undo) {
  if (undo->recorded)
    ended_insert(d, undo->at, undo->id, undo->uid);
}

static void job_unlink(struct dspkd *d, struct djob *j) {
  for (struct djob **p = &d->jobs; *p; p = &(*p)->next)
    if (*p == j) {
      *p = j->next;
      d->njobs--;
      return;
    }
}

/* Answers every job.end that waits for job j (ended: true, what the first
 * one closed), and lets their callers go. */
static void djob_answer_ends(struct djob *j) {
  struct dspk__pval v[5] = {[DSPK__R_JEND_JOB] = dspk__pv_uint(j->id),
                            [DSPK__R_JEND_ENDED] = dspk__pv_bool(true),
                            [DSPK__R_JEND_CONNECTIONS] = dspk__pv_uint(j->end_conns),
                            [DSPK__R_JEND_INFLIGHT] = dspk__pv_uint(j->end_inflight),
                            [DSPK__R_JEND_BUFFERS] = dspk__pv_uint(j->end_buffers)};
  for (size_t i = 0; i < j->nends; i++) {
    struct conn *c = j->ends[i].c;
    struct wreq *wr = dspkd_result(j->ends[i].msgid, DSPK__M_JOB_END, v);
    if (wr)
      dspkd_conn_send(c, wr);
    else /* never nothing: the connection closes if even this fails */
      dspkd_conn_send_error(c, j->ends[i].msgid, DSPK_ENOMEM,
                            "out of memory: the answer could not be built");
    dspkd_conn_paid(c);
  }
  free(j->ends);
  j->ends = NULL;
  j->nends = 0;
}

/* Answers a job.end whose connections are all gone and frees the job.  An
 * end that waited for requests in flight logs what became of them: a task
 * that a cancel does not stop (on vulkan, a raw kernel) ran to its end,
 * which is what kept the epilog waiting. */
static void djob_finish(struct dspkd *d, struct djob *j) {
  if (j->ended && j->end_canceled + j->end_ran > 0)
    dspkd_info("Slurm job %" PRIu64 ": its end is done: %" PRIu64 " request(s) canceled, %"
               PRIu64 " ran to their end (work a cancel does not stop)", j->id,
               j->end_canceled, j->end_ran);
  djob_answer_ends(j);
  job_unlink(d, j);
  free(j);
}

/* Whether process pid no longer exists: kill(2) with signal 0 answers
 * ESRCH.  A live process of another user answers EPERM (or 0 to root):
 * under a /proc mounted hidepid=invisible (the packaged unit's
 * ProtectProc=invisible) its /proc/PID is absent all the same, and it is
 * hidden, not gone. */
static bool process_gone(pid_t pid) {
  return kill(pid, 0) != 0 && errno == ESRCH;
}

/* The job named by path, a cgroup path of /proc/PID/cgroup: the id of its
 * first component "job_<digits>" (digits from 1 to 2^64-1 without a leading
 * zero) (Slurm's cgroup plugins: v1
 * /slurm/uid_U/job_N/step_S, v2 /system.slice/slurmstepd.scope/job_N/...).
 * DSPKD_CG_JOB with *id, DSPKD_CG_NONE for no such component, or
 * DSPKD_CG_TWO when another component names another job (a directory made
 * inside a job's cgroup). */
static int path_job(const char *path, uint64_t *id) {
  int state = DSPKD_CG_NONE;
  for (const char *p = strstr(path, "/job_"); p; p = strstr(p + 1, "/job_")) {
    char *end;
    unsigned long long v;
    /* A job id as every other parser has it (SLURM_JOB_ID, hello's DSPK_JOB,
     * dspk-submit --job, the state file): no leading zero, so job_099001 and
     * job_0 name no job (Slurm writes neither). */
    if (p[5] < '1' || p[5] > '9')
      continue;
    errno = 0;
    v = strtoull(p + 5, &end, 10);
    if (errno || (*end != '/' && *end != '\n' && *end != '\0'))
      continue;
    if (state == DSPKD_CG_JOB && v != *id)
      return DSPKD_CG_TWO;
    *id = v;
    state = DSPKD_CG_JOB;
  }
  return state;
}

/* The kernel's PF_EXITING (include/linux/sched.h), in /proc/PID/stat's
 * flags: set when the task begins to exit, never cleared. */
#define TASK_PF_EXITING 0x00000004u

/* Whether process pid's cgroup, just read, can be believed: its thread
 * group leader (what /proc/PID/cgroup reads) is, after the read, neither
 * exiting (PF_EXITING, which is never cleared: not exiting after the read
 * is not exiting during it) nor a zombie or dead (state Z, X).  An exiting
 * task's cgroup reads as the root of every cgroup v1 hierarchy
 * (proc_cgroup_show), as no job: a process that connected from a child
 * and left it unreaped, or whose main thread called pthread_exit, would
 * otherwise have its hello claim believed in its cgroup's place.  A stat
 * that cannot be read or parsed is not believed either. */
static bool cgroup_believable(pid_t pid) {
  char path[64], buf[1024], state;
  unsigned flags;
  const char *rp;
  size_t n;
  FILE *f;

  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  if (!(f = fopen(path, "re")))
    return false;
  n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* "PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ...": COMM may
   * hold blanks and parentheses, so the fields after it follow its last
   * ')'. */
  if (!(rp = strrchr(buf, ')')) ||
      sscanf(rp + 1, " %c %*d %*d %*d %*d %*d %u", &state, &flags) != 2)
    return false;
  return !strchr("ZXx", state) && !(flags & TASK_PF_EXITING);
}

/* Whether the comma list of controllers list (a /proc/PID/cgroup line's
 * second field) has name. */
static bool has_controller(const char *list, size_t len, const char *name) {
  size_t n = strlen(name);
  for (const char *s = list, *end = list + len; s < end;) {
    const char *comma = memchr(s, ',', (size_t)(end - s));
    size_t k = comma ? (size_t)(comma - s) : (size_t)(end - s);
    if (k == n && memcmp(s, name, n) == 0)
      return true;
    s += k + 1;
  }
  return false;
}

/* SO_PEERPIDFD (Linux 6.5, asm-generic/socket.h), where the headers lack
 * it: a pidfd of the peer's process as recorded at connect. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* The peer's pidfd (SO_PEERPIDFD on the connection's fd): 0 with *pidfd,
 * -1 when the kernel has no such option (ENOPROTOOPT: before Linux 6.5;
 * *pidfd -1, the pid alone is known), 2 when no descriptor could be made
 * (out of descriptors or memory: nothing can be checked), or 1 when the
 * peer's process no longer exists (the kernel can make no pidfd of it: its
 * pid may be another process's by now). */
static int peer_pidfd(int fd, int *pidfd) {
  socklen_t len = sizeof *pidfd;
  *pidfd = -1;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, pidfd, &len) == 0 && *pidfd >= 0)
    return 0;
  *pidfd = -1;
  if (errno == ENOPROTOOPT || errno == EOPNOTSUPP)
    return -1;
  return errno == EMFILE || errno == ENFILE || errno == ENOMEM ? 2 : 1;
}

/* Whether pidfd's process still is pid: its /proc/self/fdinfo line "Pid:"
 * (-1 once the process is gone and reaped, the number then free for another
 * process; a pid of another namespace would differ too).  A pid number
 * stays its process's while that process exists, so a process still there
 * after its cgroup was read is the one whose cgroup was read.  false when
 * the line cannot be read. */
static bool pidfd_still(int pidfd, pid_t pid) {
  char path[64], line[128];
  bool same = false;
  FILE *f;
  snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
  if (!(f = fopen(path, "re")))
    return false;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "Pid:", 4) == 0) {
      char *end;
      long v = strtol(line + 4, &end, 10);
      same = end != line + 4 && v == (long)pid;
      break;
    }
  fclose(f);
  return same;
}

/* The peer's cgroup as it connects (c->cg_state, c->cg_job), from the one
 * line of /proc/PID/cgroup of the hierarchy Slurm's proctrack/cgroup puts
 * a job's processes in: cgroup v1's freezer hierarchy, else (no freezer
 * line: cgroup v2 alone) the unified one ("0::").  The other lines are not
 * read: a v1 hierarchy that systemd delegates to the user (its
 * user@UID.service), or the unified one beside v1's, is one the process
 * may write to, and a directory job_<other> it made there named its user's
 * other job.  The job is that line's "/job_<id>/" (path_job: two jobs in
 * it are DSPKD_CG_TWO), or none, or the cgroup could not be read because
 * the process had exited already, or not believed because it was exiting
 * (a zombie, or its main thread gone: cgroup_believable).  A cgroup
 * that cannot be read for another reason (permissions, or a /proc that
 * hides other users' processes) is passed by (none).  Read at once, while
 * the pid SO_PEERCRED recorded is still the peer's: read later, at the
 * first device request, a process that connected and handed the socket on
 * (or daemonized) would be gone and its claim believed, or its pid another
 * process's.  Even at once the peer may have exited and its pid been taken
 * by another process (of the uid's other job) before the accept: where the
 * kernel gives the peer's pidfd (SO_PEERPIDFD, Linux 6.5), the process is
 * checked through it after the read, and a peer gone by then (its pid
 * perhaps another's) is DSPKD_CG_GONE (outside probe 16 F2); without it
 * (ENOPROTOOPT) a reused pid is not caught (docs/security.md).  fd: the
 * connection's socket. */
void dspkd_job_peer_cgroup(struct conn *c, int fd) {
  char path[64], *line = NULL, *v2 = NULL, *v1 = NULL;
  size_t cap = 0;
  FILE *f;
  uint64_t id = 0;
  bool oom = false;
  int pidfd = -1;

  c->cg_state = DSPKD_CG_NONE;
  if (c->pid <= 0)
    return;
  switch (peer_pidfd(fd, &pidfd)) {
  case 1:
    c->cg_state = DSPKD_CG_GONE;
    return;
  case 2: /* not believed, as a cgroup that could not be read whole */
    c->cg_state = DSPKD_CG_TWO;
    return;
  default:
    break;
  }
  dspkd_test_peer_pause(c->pid);
  snprintf(path, sizeof path, "/proc/%ld/cgroup", (long)c->pid);
  if (!(f = fopen(path, "re"))) {
    int e = errno;
    if ((e == ENOENT || e == ESRCH) && (process_gone(c->pid) ||
                                        (pidfd >= 0 && !pidfd_still(pidfd, c->pid))))
      c->cg_state = DSPKD_CG_GONE;
    else
      dspkd_debug(DSPKD_PEER_FMT ": its cgroup cannot be read (%s): passed by",
                  DSPKD_PEER_ARGS(c), e == ENOENT ? "the process is hidden" : strerror(e));
    if (pidfd >= 0)
      close(pidfd);
    return;
  }
  /* "ID:CONTROLLERS:PATH" a line; the path may hold colons.  A line that
   * cannot be kept (out of memory) or a read error leaves nothing to
   * believe: DSPKD_CG_TWO, as a cgroup that names two jobs. */
  while (!oom && getline(&line, &cap, f) > 0) {
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
      continue;
    if (!v1 && has_controller(c1 + 1, (size_t)(c2 - c1 - 1), "freezer"))
      oom = !(v1 = strdup(c2 + 1));
    else if (!v2 && c1 == line + 1 && line[0] == '0' && c2 == c1 + 1)
      oom = !(v2 = strdup(c2 + 1));
  }
  oom = oom || ferror(f);
  free(line);
  fclose(f);
  if (oom)
    c->cg_state = DSPKD_CG_TWO;
  else if (!cgroup_believable(c->pid))
    c->cg_state = process_gone(c->pid) ? DSPKD_CG_GONE : DSPKD_CG_EXITING;
  else if (pidfd >= 0 && !pidfd_still(pidfd, c->pid))
    c->cg_state = DSPKD_CG_GONE; /* what was read is another process's */
  else if (v1 || v2)
    c->cg_state = path_job(v1 ? v1 : v2, &id);
  if (pidfd >= 0)
    close(pidfd);
  if (c->cg_state == DSPKD_CG_JOB)
    c->cg_job = id;
  free(v1);
  free(v2);
}

static void job_bind(struct conn *c, struct djob *j) {
  c->job = j;
  c->job_state = 1;
  if (j) {
    j->nconns++;
    dspkd_debug(DSPKD_PEER_FMT ": Slurm job %" PRIu64, DSPKD_PEER_ARGS(c), j->id);
  }
}

/* Whether connection c names a job, and which (*id): its cgroup's (job 0
 * too), else the one its hello claimed (0 there means none); *how says
 * which, for messages. */
static bool conn_names_job(const struct conn *c, uint64_t *id, const char **how) {
  if (c->cg_state == DSPKD_CG_JOB) {
    *how = "cgroup";
    *id = c->cg_job;
    return true;
  }
  *how = "claimed";
  *id = c->job_claim;
  return *id != 0;
}

int dspkd_job_decide(struct conn *c, struct djob **out, char *msg, size_t len) {
  struct dspkd *d = c->d;
  uint64_t claim;
  const char *how;
  size_t mine = 0;
  struct djob *only = NULL;

  *out = NULL;
  for (struct djob *j = d->jobs; j; j = j->next)
    if (!j->ended && c->uid != (uid_t)-1 && j->uid == c->uid) {
      mine++;
      only = j;
    }
  /* A job named is a claim whatever its id: "/job_0/" names job 0, which
   * is never registered (job.register refuses 0, and so does hello: its
   * job_claim 0 means none). */
  if (c->cg_state == DSPKD_CG_GONE && mine) {
    snprintf(msg, len, "the process that connected (pid %ld) had exited before its cgroup "
             "could be read, and uid %ld has %zu Slurm job(s) here: connect from the job's "
             "own process", (long)c->pid, (long)c->uid, mine);
    return DSPK_EPERM;
  }
  /* Nor the cgroup of a process that was exiting, which reads as the root
   * (a process of one job connecting from an unreaped child, to claim
   * another job of its uid: outside probe 15 F1). */
  if (c->cg_state == DSPKD_CG_EXITING && mine) {
    snprintf(msg, len, "the process that connected (pid %ld) was exiting, a zombie, or its "
             "main thread had exited when its cgroup was read, and uid %ld has %zu Slurm "
             "job(s) here: connect from the job's own process, whose main thread lives",
             (long)c->pid, (long)c->uid, mine);
    return DSPK_EPERM;
  }
  /* Neither job of a cgroup that names two is believed, nor a claim. */
  if (c->cg_state == DSPKD_CG_TWO && mine) {
    snprintf(msg, len, "the cgroup of the process that connected (pid %ld) names two Slurm "
             "jobs (or could not be read whole), and uid %ld has %zu Slurm job(s) here: "
             "connect from the job's own process", (long)c->pid, (long)c->uid, mine);
    return DSPK_EPERM;
  }
  if (conn_names_job(c, &claim, &how)) {
    struct djob *j = job_find(d, claim);
    uid_t ended_uid;
    bool ended = dspkd_job_was_ended(d, claim, &ended_uid), admin;
    if (j && j->uid == c->uid) {
      *out = j;
      return 0;
    }
    /* Only an admin learns about another user's job. */
    admin = (j || (ended && ended_uid != c->uid)) && dspkd_admin_is(c);
    if (j && admin) {
      snprintf(msg, len, "Slurm job %" PRIu64 " (%s) runs as another user on this node", claim,
               how);
      return DSPK_EPERM;
    }
    if (ended && (admin || (c->uid != (uid_t)-1 && ended_uid == c->uid))) {
      snprintf(msg, len, "Slurm job %" PRIu64 " (%s) has ended on this node", claim, how);
      return DSPK_EPERM;
    }
    /* Not registered here, or (to a non-admin, who is told no more)
     * another user's. */
    if (mine) {
      snprintf(msg, len, "Slurm job %" PRIu64 " (%s) is not registered on this node for uid "
               "%ld, which has %zu job(s) here", claim, how, (long)c->uid, mine);
      return DSPK_EPERM;
    }
    return 0; /* no job of this uid here: as without Slurm */
  }
  if (mine > 1) {
    snprintf(msg, len, "uid %ld has %zu Slurm jobs on this node: name one (hello's job, "
             "which the clients take from SLURM_JOB_ID)", (long)c->uid, mine);
    return DSPK_EPERM;
  }
  *out = only;
  return 0;
}

int dspkd_job_resolve(struct conn *c, char *msg, size_t len) {
  struct djob *j;
  int err;
  if (c->job_state)
    return 0;
  if ((err = dspkd_job_decide(c, &j, msg, len)) < 0)
    return err;
  job_bind(c, j);
  return 0;
}

int dspkd_job_dev_allowed(const struct dspkd *d, const struct djob *j, bool decided,
                          const struct device *dev) {
  char u[DSPKD_UUID_LEN];
  if (strcmp(dev->be->name, "cpu") == 0)
    return 1;
  if (!j) /* not decided yet: the cpu only */
    return decided && !dspkd_jobs_required(d);
  if (dspkd_uuid_norm(dev->info.uuid, sizeof dev->info.uuid, u) != 0)
    return 0;
  for (int i = 0; i < j->ndevs; i++)
    if (strcmp(j->uuid[i], u) == 0)
      return 1;
  return 0;
}

int dspkd_job_dev_ok(const struct conn *c, const struct device *dev) {
  return dspkd_job_dev_allowed(c->d, c->job, c->job_state != 0, dev);
}

void dspkd_job_request_done(struct conn *c, int err) {
  struct djob *j = c->job;
  if (!j || !j->ended || !c->closing)
    return;
  if (err == DSPK_ECANCELED)
    j->end_canceled++;
  else
    j->end_ran++;
}

void dspkd_job_conn_gone(struct conn *c) {
  struct djob *j = c->job;
  c->job = NULL;
  if (!j || --j->nconns > 0 || !j->ended)
    return;
  djob_finish(c->d, j);
}

/* ---- job.register, job.end ----------------------------------------------- */

#define fail(r, code, ...) dspk__fail((r)->msg, sizeof (r)->msg, (code), __VA_ARGS__)

/* The params were checked against proto/schema.c's table before these
 * handlers run (job > 0, uid < 2^32-1, at most 64 devices). */

static void swap_devices(struct djob *a, struct djob *b) {
  char u[DSPKD_JOB_MAX_DEVICES][DSPKD_UUID_LEN];
  int n = a->ndevs;
  memcpy(u, a->uuid, sizeof u);
  a->ndevs = b->ndevs;
  memcpy(a->uuid, b->uuid, sizeof u);
  b->ndevs = n;
  memcpy(b->uuid, u, sizeof u);
}

/* job.register made durable (daemon/jobstate.c): the state file written,
 * or the registration undone and EIO.  created: the job is new; old: the
 * devices it had; left: where it left the ended list (ended_forget). */
static int register_persist(struct req *r, struct djob *j, bool created, struct djob *old,
                            const struct dspkd_ended_undo *left) {
  struct dspkd *d = r->c->d;
  char why[sizeof r->msg];
  uint64_t id = j->id;
  if (dspkd_jobstate_save(d, why, sizeof why) == 0)
    return 0;
  ended_unforget(d, left);
  if (created) {
    job_unlink(d, j);
    free(j);
  } else {
    swap_devices(j, old);
  }
  dspkd_error(DSPKD_PEER_FMT ": job.register of Slurm job %" PRIu64 " failed: %s",
              DSPKD_PEER_ARGS(r->c), id, why);
  r->logged = true; /* that line is the one: no generic "client N" line after it */
  return fail(r, DSPK_EIO, created ? "%s; Slurm job %" PRIu64 " is not registered (nothing "
              "changed)" : "%s; Slurm job %" PRIu64 " keeps its registration (nothing changed)",
              why, id);
}

/* job.end made durable: the state file written, or the end undone and EIO
 * (nothing of the job is closed then). */
static int end_persist(struct req *r, struct djob *j, uint64_t id,
                       const struct dspkd_ended_undo *u) {
  struct dspkd *d = r->c->d;
  char why[sizeof r->msg];
  if (dspkd_jobstate_save(d, why, sizeof why) == 0)
    return 0;
  dspkd_job_end_unrecord(d, u);
  if (j)
    j->ended = false;
  dspkd_error(DSPKD_PEER_FMT ": job.end of Slurm job %" PRIu64 " failed: %s",
              DSPKD_PEER_ARGS(r->c), id, why);
  r->logged = true; /* as in register_persist */
  return fail(r, DSPK_EIO, "%s; Slurm job %" PRIu64 " is not ended (nothing changed)", why, id);
}

/* job.register's devices: those of this daemon the allocation matched, the
 * cpu devices always, the others by UUID. */
struct matched {
  const struct dspkd *d;
  const struct djob *j;
};

static void pack_matched(const void *ud, struct dspk__wbuf *w) {
  const struct dspkd *d = ((const struct matched *)ud)->d;
  const struct djob *j = ((const struct matched *)ud)->j;
  int n = 0;
  for (int i = 0; i < d->ndevs; i++)
    n += d->devs[i].open_state == 1 && dspkd_job_dev_allowed(d, j, true, &d->devs[i]);
  msgpack_pack_array(&w->pk, (size_t)n);
  for (int i = 0; i < d->ndevs; i++)
    if (d->devs[i].open_state == 1 && dspkd_job_dev_allowed(d, j, true, &d->devs[i]))
      dspk__pack_str(&w->pk, d->devs[i].id);
}

int dspkd_m_job_register(struct req *r) {
  struct dspkd *d = r->c->d;
  const msgpack_object *devs = r->v[DSPK__JREG_DEVICES].set ? r->v[DSPK__JREG_DEVICES].v.o
                                                             : NULL;
  struct djob *j, tmp;
  bool created;
  struct dspkd_ended_undo left = {0};
  int err;
  uint64_t id = r->v[DSPK__JREG_JOB].v.u, uid = r->v[DSPK__JREG_UID].v.u;
  struct wreq *wr;
  struct dspk__pval v[3];
  struct matched mt;
  int nmatch = 0;
  uint32_t at[DSPKD_JOB_MAX_DEVICES]; /* tmp.uuid[i] is devices[at[i]] */

  _Static_assert(DSPKD_JOB_MAX_DEVICES == DSPK__JOB_MAX_UUIDS, "job.register devices");
  _Static_assert(sizeof(uid_t) == 4, "job.register uid in proto/schema.c");
  memset(&tmp, 0, sizeof tmp);
  tmp.id = id;
  tmp.uid = (uid_t)uid;
  for (uint32_t i = 0; devs && i < devs->via.array.size; i++) {
    const msgpack_object *o = &devs->via.array.ptr[i];
    /* A str (the schema's item checked it); a NUL would cut the UUID
     * short (as every str parameter: EINVAL). */
    if (o->via.str.size && memchr(o->via.str.ptr, 0, o->via.str.size))
      return fail(r, DSPK_EINVAL, "devices[%u]: the string holds a NUL byte", i);
    char why[64];
    if (dspk__uuid_parse(o->via.str.ptr, o->via.str.size, tmp.uuid[tmp.ndevs], why, sizeof why))
      return fail(r, DSPK_EINVAL, "devices[%u]: expected " DSPK__EXPECT_UUID ": %s", i, why);
    /* The same GPU named twice (two spellings): once. */
    bool dup = false;
    for (int k = 0; k < tmp.ndevs && !dup; k++)
      dup = strcmp(tmp.uuid[k], tmp.uuid[tmp.ndevs]) == 0;
    if (!dup)
      at[tmp.ndevs++] = i;
  }
  /* A UUID that names none of this daemon's devices is the prolog's error
   * (a GPU this node does not have, or one that could not be opened):
   * ENODEV, so that the prolog fails and Slurm reports it, rather than a
   * job registered without its GPU.  Checked before anything changes. */
  for (int i = 0; i < tmp.ndevs; i++) {
    char u[DSPKD_UUID_LEN];
    bool found = false;
    for (int k = 0; k < d->ndevs && !found; k++)
      found = d->devs[k].open_state == 1 &&
              dspkd_uuid_norm(d->devs[k].info.uuid, sizeof d->devs[k].info.uuid, u) == 0 &&
              strcmp(u, tmp.uuid[i]) == 0;
    if (!found)
      return fail(r, DSPK_ENODEV, "devices[%u]: no device of this daemon has the UUID %s",
                  at[i], tmp.uuid[i]);
  }
  j = job_find(d, id);
  if (j && j->uid != tmp.uid)
    return fail(r, DSPK_EBUSY, "Slurm job %" PRIu64 " is registered for uid %ld already",
                id, (long)j->uid);
  created = !j;
  if (!j) {
    if (d->njobs >= MAX_JOBS)
      return fail(r, DSPK_ELIMIT, "%d Slurm jobs are registered on this node already", MAX_JOBS);
    if (!(j = calloc(1, sizeof *j)))
      return DSPK_ENOMEM;
    j->id = id;
    j->uid = tmp.uid;
    j->next = d->jobs;
    d->jobs = j;
    d->njobs++;
    /* A requeued job comes back with its id: it may be claimed again. */
    ended_forget(d, id, &left);
  }
  /* A second registration (the prolog ran again) replaces the devices
   * (tmp keeps the old ones until the state file has the new). */
  swap_devices(j, &tmp);
  if ((err = register_persist(r, j, created, &tmp, &left)) < 0)
    return err;
  for (int i = 0; i < d->ndevs; i++)
    nmatch += d->devs[i].open_state == 1 && dspkd_job_dev_allowed(d, j, true, &d->devs[i]);
  v[DSPK__R_JREG_JOB] = dspk__pv_uint(id);
  v[DSPK__R_JREG_UID] = dspk__pv_uint(uid);
  mt.d = d;
  mt.j = j;
  v[DSPK__R_JREG_DEVICES] = dspk__pv_pack(pack_matched, &mt);
  if (!(wr = dspkd_result(r->msgid, DSPK__M_JOB_REGISTER, v)))
    return DSPK_ENOMEM;
  dspkd_conn_send(r->c, wr);
  dspkd_info(DSPKD_PEER_FMT ": Slurm job %" PRIu64 " registered for uid %ld, %d GPU(s), "
             "%d device(s) here", DSPKD_PEER_ARGS(r->c), id,
             (long)j->uid, j->ndevs, nmatch);
  return 0;
}

int dspkd_m_job_end(struct req *r) {
  struct dspkd *d = r->c->d;
  struct djob *j, *e;
  uint64_t id = r->v[DSPK__JEND_JOB].v.u, nconns = 0, inflight = 0, buffers = 0;
  struct dspkd_ended_undo undo;
  int err;

  j = job_find(d, id);
  /* A job.end of a job still ending (the epilog ran again, or twice) waits
   * with the first and gets the same answer. */
  if (!j && (e = job_ending(d, id)))
    return job_end_wait(r, e);
  if (j && r->c->job == j)
    return fail(r, DSPK_EINVAL, "this connection belongs to Slurm job %" PRIu64
                " and cannot end it", id);
  if (j && (err = job_end_room(j)) < 0)
    return err;
  /* A connection of the job that has not asked for a device yet (its job
   * undecided) whose cgroup or hello names it is the job's too: bound now,
   * so that it is closed with the others.  (Not one that would fall to it
   * as its uid's only job: an admin's status or trace connection.) */
  for (struct conn *c = d->conns; j && c; c = c->next) {
    const char *how;
    uint64_t named;
    if (!c->job_state && !c->closing && c != r->c && conn_names_job(c, &named, &how) &&
        named == id && c->uid == j->uid)
      job_bind(c, j);
  }
  dspkd_job_end_record(d, id, j ? j->uid : (uid_t)-1, &undo);
  if (j)
    j->ended = true;
  if ((err = end_persist(r, j, id, &undo)) < 0)
    return err;
  if (!j) {
    /* Not registered: nothing to end, and no counts. */
    struct dspk__pval v[5] = {[DSPK__R_JEND_JOB] = dspk__pv_uint(id),
                              [DSPK__R_JEND_ENDED] = dspk__pv_bool(false)};
    struct wreq *wr = dspkd_result(r->msgid, DSPK__M_JOB_END, v);
    if (!wr)
      return DSPK_ENOMEM;
    dspkd_conn_send(r->c, wr);
    return 0;
  }
  char why[64];
  snprintf(why, sizeof why, "Slurm job %" PRIu64 " ended on this node", id);
  /* Every connection still bound to the job counts, one being closed
   * already included: at a Slurm job's end slurmstepd has killed the job's
   * processes before the epilog runs, so a connection whose task still runs
   * on a device (a raw kernel, a vulkan gemm: a cancel does not stop it) is
   * closing by now, yet it stays the job's until that task ends, and the
   * answer, the log and status must say so (they said 0 connections and 0
   * requests in flight while status showed both: probe 18 F1).  Its buffers
   * are counted as status counts them: those in its table and those that a
   * request still holds (freed when that request ends). */
  for (struct conn *c = d->conns; c; c = c->next) {
    if (c->job != j)
      continue;
    nconns++;
    inflight += dspkd_conn_inflight(c);
    buffers += c->nbufs + c->held_bufs;
    if (!c->closing)
      dspkd_conn_close_notice(c, DSPK_EPERM, why);
  }
  /* "In flight", not "canceled": what a cancel does not stop runs to its
   * end, and the line of the end's end (djob_finish) says which did. */
  dspkd_info(DSPKD_PEER_FMT ": Slurm job %" PRIu64 " ended: %" PRIu64 " connection(s) "
             "closed, %" PRIu64 " request(s) in flight, %" PRIu64 " buffer(s) freed",
             DSPKD_PEER_ARGS(r->c), id, nconns, inflight, buffers);
  /* Answered when the last of its connections is gone (now, when none). */
  j->end_conns = nconns;
  j->end_inflight = inflight;
  j->end_buffers = buffers;
  job_end_wait(r, j); /* cannot fail: its room was made above */
  if (!j->nconns)
    djob_finish(d, j);
  return 0;
}

/* Answers now the job.end calls still waiting for their jobs' connections
 * (the stop closes those connections at its deadline: their answers are
 * what the ends closed, as when the last connection goes). */
void dspkd_jobs_answer_ends(struct dspkd *d) {
  for (struct djob *j = d->jobs; j; j = j->next)
    djob_answer_ends(j);
}

void dspkd_jobs_free(struct dspkd *d) {
  while (d->jobs) {
    struct djob *j = d->jobs;
    d->jobs = j->next;
    /* A pending job.end holds its caller (j->ends) only while a
     * connection of the job is alive, and the stop waits for every
     * connection: none is left here. */
    free(j->ends);
    free(j);
  }
  d->njobs = 0;
}
