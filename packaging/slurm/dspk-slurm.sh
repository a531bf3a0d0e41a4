# -- The part the prolog and the epilog share (packaging/slurm/dspk-slurm.sh,
# put into both when they are configured).  Before it: what (prolog or
# epilog), tvar (the name of its timeout variable) and tmo (that variable's
# value).
#
# dspk-submit is DSPK_SUBMIT, else the one of the tree this script is
# installed in, found from the script's real path: symbolic links resolved,
# so that a link to the script (Prolog=/etc/slurm/prolog.d/*) finds it too.
self=$(readlink -f -- "$0") || self=$0
# in_tree REL: the script's directory/REL, its ".." taken away (self has no
# link left, so that is the same file), for the messages that name it.
in_tree() {
  realpath -s -m -- "${self%/*}/$1" 2>/dev/null || printf '%s\n' "${self%/*}/$1"
}
submit=${DSPK_SUBMIT:-$(in_tree @DSPK_SLURM_TO_BIN@/dspk-submit)}
socket=${DSPK_SOCKET:-/run/dspk/dspkd.sock}
# need VAR: exit 2 with one line when Slurm's variable VAR is unset or empty.
need() {
  eval "[ -n \"\${$1:-}\" ]" && return
  if eval "[ -n \"\${$1+set}\" ]"; then
    echo "dspk $what: ${job:+job $job: }$1 is empty" >&2
  else
    echo "dspk $what: ${job:+job $job: }$1 is not set" >&2
  fi
  exit 2
}
job=
need SLURM_JOB_ID
# A job id as dspkd --end-job, dspk-submit and the state file have it:
# decimal digits from 1 to 18446744073709551615 (2^64-1), without a leading
# zero or blanks (05 is no id, not job 5).  Checked before anything else,
# so that a bad one is exit 2 with one line, whether a daemon listens or
# not (the epilog without one would take --end-job's refusal of it for a
# job it could not end).
case $SLURM_JOB_ID in
  *[!0-9]* | 0*) idok= ;;
  *) idok=$(awk -v a="$SLURM_JOB_ID" 'BEGIN {
       n = length(a)
       print (n < 20 || (n == 20 && (a "") <= "18446744073709551615")) ? "y" : ""
     }') ;;
esac
if [ -z "$idok" ]; then
  echo "dspk $what: SLURM_JOB_ID is '$SLURM_JOB_ID': expected a Slurm job id (decimal" \
    "digits from 1 to 18446744073709551615, without a leading zero)" >&2
  exit 2
fi
job=$SLURM_JOB_ID
# The timeout is whole seconds from 1 (unset or empty: 120); anything else
# would be timeout(1)'s (0: none at all, 1.5, 2m): exit 2, with one line.
tmo=${tmo:-120}
digits=${tmo#"${tmo%%[!0]*}"}
case $tmo in
  *[!0-9]*) digits= ;;
esac
if [ -z "$digits" ] || [ "${#digits}" -gt 9 ]; then
  echo "dspk $what: job $job: $tvar is '$tmo': expected whole seconds from 1 to" \
    "999999999 (unset or empty: 120)" >&2
  exit 2
fi
# A socket path longer than a Unix socket's 107 bytes is no daemon's: said
# once, exit 2, before dspk-submit or dspkd --end-job refuse it (the epilog
# then said the job "stays registered" and named a command that fails the
# same way: outside probe 15 F2).
bytes=$(printf '%s' "$socket" | LC_ALL=C wc -c)
if [ "$bytes" -gt 107 ]; then
  echo "dspk $what: job $job: DSPK_SOCKET is $bytes bytes long, more than a Unix socket's" \
    "107: no dspkd can listen on $socket; set DSPK_SOCKET to the daemon's socket" >&2
  exit 2
fi
# A path must be an executable file (dash's command -v takes any file for one).
case $submit in
  */*) [ -f "$submit" ] && [ -x "$submit" ] ;;
  *) command -v -- "$submit" >/dev/null 2>&1 ;;
esac || {
  if [ -n "${DSPK_SUBMIT:-}" ]; then
    echo "dspk $what: job $job: no executable dspk-submit at $submit (named by DSPK_SUBMIT)" >&2
  else
    echo "dspk $what: job $job: no executable dspk-submit at $submit (the one of this" \
      "script's tree; DSPK_SUBMIT names another)" >&2
  fi
  exit 127
}

# run_submit WHY ARGS...: dspk-submit --socket SOCKET ARGS..., bounded by the timeout;
# when it runs out (exit 124), one line on stderr says so, ending with WHY.
run_submit() {
  why=$1
  shift
  timeout "$tmo" "$submit" --socket "$socket" "$@"
  rc=$?
  [ "$rc" -ne 124 ] ||
    echo "dspk $what: job $job: no answer from dspkd on $socket within $tmo s ($tvar);" \
      "$why" >&2
  return "$rc"
}

# capture COMMAND...: COMMAND run with LC_ALL=C (the system's reasons in
# English), its standard output in ans, its standard error in err and its
# status in rc.
capture() {
  nl='
'
  all=$(exec 4>&1
    e=$(LC_ALL=C
      export LC_ALL
      "$@" 2>&1 >&4 4>&-)
    r=$?
    printf '\n@@dspk exit %s\n%s' "$r" "$e")
  ans=${all%%"$nl@@dspk exit "*}
  rest=${all#*"$nl@@dspk exit "}
  rc=${rest%%"$nl"*}
  case $rest in
    *"$nl"*) err=${rest#*"$nl"} ;;
    *) err= ;;
  esac
}

# submit_capture WHY ARGS...: capture run_submit WHY ARGS... (the timeout's
# line in err), so that the script can check the answer before it takes an
# exit 0 for one.
submit_capture() {
  capture run_submit "$@"
}

# one_line TEXT: TEXT's lines joined with "; ", blank ones dropped (a
# command's output quoted in a message of one line).
one_line() {
  printf '%s\n' "$1" | LC_ALL=C awk '
    { sub(/\r$/, ""); sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") }
    NF { o = o (o == "" ? "" : "; ") $0 }
    END { printf "%s", o }'
}

# answered WHAT [UID]: whether ans is dspk-submit's JSON answer (one line) to
# WHAT for this job: job.register's {"job":N,"uid":UID,"devices":[...]} or
# job.end's {"job":N,"ended":...}.  An exit 0 without it (a DSPK_SUBMIT
# that is not dspk-submit, /bin/true) is no registration and no end.
answered() {
  a=${ans%"$nl"}
  case $a in
    *"$nl"*) return 1 ;;
  esac
  if [ "$1" = register ]; then
    case $a in
      "{\"job\":$job,\"uid\":$2,\"devices\":["*"]}") return 0 ;;
    esac
  else
    case $a in
      "{\"job\":$job,\"ended\":true,"*"}" | "{\"job\":$job,\"ended\":false}") return 0 ;;
    esac
  fi
  return 1
}
# -- End of the shared part.
