# -- The part the prolog and the epilog share (packaging/slurm/dspk-slurm.sh,
# put into both when they are configured).  Before it: what (prolog or
# epilog), tvar (the name of its timeout variable) and tmo (that variable's
# value).
#
# now_cs: sets now to the monotonic clock in hundredths of a second (the
# uptime, /proc/uptime: no change of the date moves it; where there is none,
# the date's seconds).  The timeout is a deadline on this clock, taken once
# when the script starts (deadline, below): every command and every wait of
# the script is bounded by the time left to it, so that the script as a
# whole keeps within the timeout (probe 19 G1: the epilog counted its tries
# of --end-job, each a second's sleep and a command, and overran it).
now_cs() {
  now=
  if read -r now _ 2>/dev/null </proc/uptime; then
    case $now in
      *[!0-9.]* | *.*.* | .* | *.) now= ;;
      *.??) now=${now%.*}${now#*.} ;;
      *.?) now=${now%.*}${now#*.}0 ;;
      *) now=${now}00 ;;
    esac
    # No leading zero: $(( )) would take 0... for octal.
    now=${now#"${now%%[!0]*}"}
    now=${now:-0}
  fi
  [ -n "$now" ] || now=$(($(date +%s) * 100))
}
now_cs
started=$now
# dspk-submit is DSPK_SUBMIT, else the one of the tree this script is
# installed in, found from the script's real path: symbolic links resolved,
# so that a link to the script (Prolog=/etc/slurm/prolog.d/*) finds it too.
self=$(readlink -f -- "$0") || self=$0

# Text from outside (a variable, a path, a map file's line, what a command
# said) is quoted in the scripts' messages as dspkd quotes a configuration
# file's text (dspk.conf(5), proto/utf8.c's dspk__utf8_visible): a
# backslash as \\, a tab, newline and CR as \t, \n, \r, another C0
# control, DEL or a byte that is no UTF-8 as \xNN, a C1 control and every
# character that prints as nothing or as a plain space as \uNNNN
# (\UNNNNNNNN above U+FFFF): the invisible ones below, the noncharacters,
# the private-use ones, and a combining mark with nothing to sit on (after
# no ASCII letter or digit and no other non-ASCII character shown as it
# is).  The two tables are proto/utf8.c's (invisible and marks), put here
# when the scripts are configured: ranges FIRST LAST, hex.
vis_invisible='@DSPK_SLURM_INVISIBLE@'
vis_marks='@DSPK_SLURM_MARKS@'
# The awk functions (vis(s) returns s quoted so), for awk run with LC_ALL=C
# (bytes) and DSPK_VIS_INVISIBLE, DSPK_VIS_MARKS set to the tables (vawk).
# shellcheck disable=SC2016 # an awk program
vis_awk='
  function vis_hex(s,  k, v) {
    s = tolower(s); v = 0
    for (k = 1; k <= length(s); k++) v = v * 16 + index("0123456789abcdef", substr(s, k, 1)) - 1
    return v
  }
  function vis_table(name, t,  a, k, n) {
    n = split(ENVIRON[name], a)
    for (k = 1; k <= n; k++) t[k] = vis_hex(a[k])
    return n / 2
  }
  function vis_in(t, n, cp,  lo, hi, mid) {
    lo = 1; hi = n + 1
    while (lo < hi) {   # the first range that ends at or after cp
      mid = int((lo + hi) / 2)
      if (t[2 * mid] < cp) lo = mid + 1; else hi = mid
    }
    return lo <= n && t[2 * lo - 1] <= cp
  }
  function vis_init(  k) {
    if (vis_ready) return
    vis_ready = 1
    for (k = 1; k < 256; k++) vis_ord[sprintf("%c", k)] = k
    vis_ni = vis_table("DSPK_VIS_INVISIBLE", vis_inv)
    vis_nm = vis_table("DSPK_VIS_MARKS", vis_mk)
  }
  # The length of the well-formed UTF-8 character at s[k], 0 for none.
  function vis_seq(s, k, n,  b, c, lo, hi, len, j) {
    b = vis_ord[substr(s, k, 1)]
    if (b < 128) return 1
    lo = 128; hi = 191
    if (b >= 194 && b <= 223) len = 2
    else if (b >= 224 && b <= 239) { len = 3; if (b == 224) lo = 160; else if (b == 237) hi = 159 }
    else if (b >= 240 && b <= 244) { len = 4; if (b == 240) lo = 144; else if (b == 244) hi = 143 }
    else return 0
    if (k + len - 1 > n) return 0
    c = vis_ord[substr(s, k + 1, 1)]
    if (c < lo || c > hi) return 0
    for (j = 2; j < len; j++) {
      c = vis_ord[substr(s, k + j, 1)]
      if (c < 128 || c > 191) return 0
    }
    return len
  }
  function vis_cp(s, k, len,  v, j) {
    v = vis_ord[substr(s, k, 1)]
    v = len == 1 ? v : len == 2 ? v - 192 : len == 3 ? v - 224 : v - 240
    for (j = 1; j < len; j++) v = v * 64 + vis_ord[substr(s, k + j, 1)] - 128
    return v
  }
  function vis_hidden(cp, base) {
    return vis_in(vis_inv, vis_ni, cp) || (cp >= 64976 && cp <= 65007) ||
      cp % 65536 >= 65534 || (cp >= 57344 && cp <= 63743) || cp >= 983040 ||
      (!base && vis_in(vis_mk, vis_nm, cp))
  }
  function vis(s,  n, k, len, cp, e, o, base) {
    vis_init()
    n = length(s); o = ""; base = 0
    for (k = 1; k <= n; k += len) {
      len = vis_seq(s, k, n); e = ""
      if (len == 0) {
        len = 1; e = sprintf("\\x%02x", vis_ord[substr(s, k, 1)])
      } else {
        cp = vis_cp(s, k, len)
        if (cp == 92) e = "\\\\"
        else if (cp == 9) e = "\\t"
        else if (cp == 10) e = "\\n"
        else if (cp == 13) e = "\\r"
        else if (cp < 32 || cp == 127) e = sprintf("\\x%02x", cp)
        else if (cp >= 128 && cp <= 159) e = sprintf("\\u%04x", cp)
        else if (len > 1 && vis_hidden(cp, base))
          e = sprintf(cp > 65535 ? "\\U%08x" : "\\u%04x", cp)
      }
      if (e != "") {
        o = o e; base = 0
      } else {
        o = o substr(s, k, len); base = len > 1 || substr(s, k, 1) ~ /[A-Za-z0-9]/
      }
    }
    return o
  }
'
# say WORDS...: the words and a newline, as they are (dash's echo would
# take the \n of a quoted text, or of a path, for a newline).
say() {
  printf '%s\n' "$*"
}
# vawk ARGS...: awk with the tables vis needs, in bytes.
vawk() {
  DSPK_VIS_INVISIBLE=$vis_invisible DSPK_VIS_MARKS=$vis_marks LC_ALL=C awk "$@"
}
# vis TEXT: TEXT quoted for a message, as above.
vis() {
  DSPK_VIS_TEXT=$1 vawk "$vis_awk"'BEGIN { printf "%s", vis(ENVIRON["DSPK_VIS_TEXT"]) }'
}
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
    say "dspk $what: ${job:+job $job: }$1 is empty" >&2
  else
    say "dspk $what: ${job:+job $job: }$1 is not set" >&2
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
  say "dspk $what: SLURM_JOB_ID is '$(vis "$SLURM_JOB_ID")': expected a Slurm job id (decimal" \
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
  say "dspk $what: job $job: $tvar is '$(vis "$tmo")': expected whole seconds from 1 to" \
    "999999999 (unset or empty: 120)" >&2
  exit 2
fi
# The deadline: the script's start plus the timeout.  Every command that
# waits goes through bounded (below), which gives it the time left (none
# left: it is not started, as if it had timed out), and the epilog's wait
# between two tries of --end-job is bounded by it too; a command killed at
# the deadline may take one more second (timeout's SIGKILL, for one that
# ignores SIGTERM).  So a script ends within its timeout plus 2 s (that
# second, and the script's own work on its message), the margin docs/cluster.md
# names.
tmo_cs=$((digits * 100))
deadline=$((started + tmo_cs))
# A socket path longer than a Unix socket's 107 bytes is no daemon's: said
# once, exit 2, before dspk-submit or dspkd --end-job refuse it (the epilog
# then said the job "stays registered" and named a command that fails the
# same way: outside probe 15 F2).
bytes=$(printf '%s' "$socket" | LC_ALL=C wc -c)
if [ "$bytes" -gt 107 ]; then
  say "dspk $what: job $job: DSPK_SOCKET is $bytes bytes long, more than a Unix socket's" \
    "107: no dspkd can listen on $(vis "$socket"); set DSPK_SOCKET to the daemon's socket" >&2
  exit 2
fi
# The socket and dspk-submit as the messages quote them (vis).
socket_v=$(vis "$socket") submit_v=$(vis "$submit")
# A path must be an executable file (dash's command -v takes any file for one).
case $submit in
  */*) [ -f "$submit" ] && [ -x "$submit" ] ;;
  *) command -v -- "$submit" >/dev/null 2>&1 ;;
esac || {
  if [ -n "${DSPK_SUBMIT:-}" ]; then
    say "dspk $what: job $job: no executable dspk-submit at $submit_v (named by" \
      "DSPK_SUBMIT)" >&2
  else
    say "dspk $what: job $job: no executable dspk-submit at $submit_v (the one of this" \
      "script's tree; DSPK_SUBMIT names another)" >&2
  fi
  exit 127
}

# left_cs: sets left to the hundredths of a second left before the deadline
# (0 or less: none).
left_cs() {
  now_cs
  left=$((deadline - now))
}
# bounded [-m] COMMAND...: COMMAND run with LC_ALL=C (the system's reasons
# in English), its standard input /dev/null, bounded by the time left before
# the deadline: its standard output in ans, its standard error in err (-m:
# both in ans, in the order written; err empty) and its status in rc (124
# when the time ran out, 137 when it also needed SIGKILL, for a command that
# ignores SIGTERM).  With no time left COMMAND is not started: rc 124, ans
# and err empty, and late set (empty when it ran).  Every command the
# scripts run that waits on something outside them goes through it
# (dspk-submit, nvidia-smi, the map file's read, stat of the map, dspkd
# --end-job), so that the timeout bounds the whole of it, and all of them
# together:
#   - COMMAND runs in a process group of its own (timeout(1), without
#     --foreground, makes one, with its own pid as the group's id), which
#     timeout kills at the timeout, COMMAND's children with it;
#   - what is left of the group once COMMAND has exited (a child it left
#     behind, such as an nvidia-smi's `sleep &`) is killed then;
#   - the output goes to files, never to a pipe: a child that kept a pipe
#     open would hold the reader (a command substitution waits for the end
#     of the pipe, not for the command) past the timeout (probe 18 F2).
# The group's id is killed after timeout is reaped: while a leftover lives,
# the id stays its group's (Linux frees a pid only when no process uses it
# as a pid, group or session); with none left, that kill finds nothing (a
# pid is given out again only after the whole pid range has been used).
# The shell's own report of a child killed by a signal ("Killed": timeout
# kills itself with its group) goes to /dev/null, so that a message stays
# the script's one line (probe 18 F3).
tdir='' bpid=''
# The temporary directory and the group still running go when the script
# exits, or is stopped by SIGTERM, SIGINT or SIGHUP (slurmd's own timeout).
# shellcheck disable=SC2317 # run by the traps
bounded_cleanup() {
  [ -z "$bpid" ] || kill -KILL "-$bpid" 2>/dev/null
  [ -z "$tdir" ] || rm -rf -- "$tdir"
}
trap bounded_cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
bounded() {
  merge=
  if [ "$1" = -m ]; then
    merge=y
    shift
  fi
  if [ -z "$tdir" ]; then
    tdir=$(mktemp -d "${TMPDIR:-/tmp}/dspk-$what.XXXXXXXX" 2>/dev/null) || {
      tdir=
      say "dspk $what: job $job: cannot make a temporary directory in ${TMPDIR:-/tmp} (for" \
        "the output of $1)" >&2
      exit 1
    }
  fi
  left_cs
  if [ "$left" -le 0 ]; then
    rc=124 ans='' err='' late=y
    return
  fi
  late=
  # timeout(1) takes the seconds with a fraction (LC_ALL=C: a point).
  secs=$((left / 100)).$((left % 100 / 10))$((left % 10))
  if [ -n "$merge" ]; then
    (LC_ALL=C; export LC_ALL; exec timeout -k 1 "$secs" "$@") </dev/null >"$tdir/out" 2>&1 &
  else
    (LC_ALL=C; export LC_ALL; exec timeout -k 1 "$secs" "$@") </dev/null >"$tdir/out" \
      2>"$tdir/err" &
  fi
  bpid=$!
  wait "$bpid" 2>/dev/null
  rc=$?
  kill -KILL "-$bpid" 2>/dev/null
  bpid=
  ans=$(cat -- "$tdir/out"; echo x)
  ans=${ans%x}
  err=
  [ -n "$merge" ] || err=$(cat -- "$tdir/err")
  rm -f -- "$tdir/out" "$tdir/err"
}
nl='
'

# submit_capture WHY ARGS...: bounded dspk-submit --socket SOCKET ARGS...;
# when the timeout runs out (rc 124, also after SIGKILL), err ends with the
# line that says so, ending with WHY, so that the script can check the
# answer before it takes an exit 0 for one.
submit_capture() {
  why=$1
  shift
  bounded "$submit" --socket "$socket" "$@"
  case $rc in
    124 | 137)
      rc=124
      if [ -n "$late" ]; then
        # What ran before (nvidia-smi, the map's read, the epilog's tries)
        # took all the time: dspkd was not asked.
        err="dspk $what: job $job: no time left to ask dspkd on $socket_v: the $tmo s of"
        err="$err $tvar ran out before; $why"
      else
        err="${err:+$err$nl}dspk $what: job $job: no answer from dspkd on $socket_v within"
        err="$err $tmo s ($tvar); $why"
      fi ;;
  esac
}

# one_line TEXT: TEXT's lines joined with "; ", blank ones dropped, each
# quoted by vis (a command's output in a message of one line).
one_line() {
  printf '%s\n' "$1" | vawk "$vis_awk"'
    { sub(/\r$/, ""); sub(/^[ \t]+/, ""); sub(/[ \t]+$/, "") }
    NF { o = o (o == "" ? "" : "; ") vis($0) }
    END { printf "%s", o }'
}

# submit_failed WHY: after submit_capture, when dspk-submit itself failed
# (an exit status other than 0 and 124: it could not connect, the daemon
# refused, a usage error), err becomes the script's one line, "dspk WHAT:
# job N: " then what dspk-submit said (its lines joined by one_line; that
# it exited RC without a word, when it said nothing) then "; WHY", so that
# the line Slurm logs names the script and the job as every other failure
# of the scripts does (probe 21 F2: the prolog passed dspk-submit's line
# on alone).  rc is kept.
submit_failed() {
  case $rc in
    0 | 124) return ;;
  esac
  sf_said=$(one_line "$err")
  [ -n "$sf_said" ] || sf_said="$submit_v exited $rc without a message"
  err="dspk $what: job $job: $sf_said; $1"
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
