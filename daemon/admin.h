/*
 * dspkd's access policy at the connection and the admin methods
 * (daemon/admin.c).  The policy comes from the configuration file's
 * [policy] section (daemon/config.h): allow_users/allow_groups decide who
 * may talk to the daemon at all (beyond the socket's file permissions),
 * admin_users/admin_groups who else, besides root and the daemon's own
 * user (always admins: dspkd_policy_is_admin), may call the admin methods
 * (and cache.clear, and see everyone's work in status, trace and metrics):
 *   daemon.reload  read the configuration file again (as SIGHUP)
 *   daemon.stop    stop the daemon in order (as SIGTERM)
 *   job.register   a Slurm job's prolog: the job, its uid and GPUs (daemon/jobs.c)
 *   job.end        its epilog: closes the job's connections
 * Loop thread only.
 */
#ifndef DSPKD_ADMIN_H
#define DSPKD_ADMIN_H

#include "daemon/dspkd.h"

/* 1 when the connection's peer passes the allow lists, else 0. */
int dspkd_admin_may_connect(struct conn *c);

/* 0 when r's peer may call the admin method, else dspkd_admin_refuse's
 * DSPK_EPERM. */
int dspkd_admin_check(struct req *r, const char *method);
/* Refuses method to r's peer, who is not an admin: a notice in the log and
 * DSPK_EPERM, with r->msg naming every way to be an admin ("METHOD:
 * permission denied: uid M is not an admin (root, the daemon's own user
 * (uid N), admin_users and admin_groups in the [policy] of dspkd.conf)"),
 * the one text of every admin refusal. */
int dspkd_admin_refuse(struct req *r, const char *method);
/* The message of the protocol.error EPERM that refuses a connection the
 * allow lists do not admit, naming every way to be admitted, into msg
 * (len bytes). */
void dspkd_admin_connect_refusal(const struct conn *c, char *msg, size_t len);
/* After a reload that took a new configuration: closes each connection
 * whose peer the new allow lists do not admit, with the protocol.error
 * EPERM a new connection of that peer gets (dspkd_admin_connect_refusal),
 * and logs how many.  Returns how many it closed. */
size_t dspkd_admin_reloaded(struct dspkd *d);
/* The handlers of daemon.reload and daemon.stop (dspkd_dispatch's
 * contract). */
int dspkd_m_daemon_reload(struct req *r);
int dspkd_m_daemon_stop(struct req *r);

/* 1 when c's peer may call the admin methods (and sees every connection in
 * full in status), under the policy in force now. */
int dspkd_admin_is(struct conn *c);

/* Whether `caller` (an admin when `admin`) sees in full what belongs to
 * uid (a connection, its Slurm jobs, its requests in status, trace and
 * metrics): an admin everything, anyone else its own uid's; a caller or an
 * owner whose uid is unknown ((uint32_t)-1) sees, or is seen by, admins
 * only.  Everything else is shown as counts or anonymous intervals. */
bool dspkd_sees_uid(const struct conn *caller, bool admin, uint32_t uid);

/* Fills shown[i] for each of c->d's devices: whether trace and metrics
 * show device i to c: the devices c may use (dspkd_devices_usable), and
 * every device to an admin outside any job, whatever job_required, so that
 * an admin observes the whole node.  Returns the job it decided (NULL:
 * none). */
struct djob *dspkd_devices_shown(struct conn *c, bool admin, bool *shown);

/* Fills usable[i] for each of c->d's devices: whether c may use device i,
 * as a request that needs a device would find (devices, buffer.create,
 * task.run: daemon/jobs.c's rule, its job decided for the look only, not
 * for good): the cpu and its Slurm job's GPUs; outside any job every device,
 * or the cpu only under job_required; the cpu only while its uid has
 * several jobs and it names none.  An admin is no exception (probe 19 G3:
 * status listed every device to an admin that job_required kept to the
 * cpu).  status' devices.  Returns the job it decided (NULL: none). */
struct djob *dspkd_devices_usable(struct conn *c, bool *usable);

#endif /* DSPKD_ADMIN_H */
