#!/usr/bin/env python3
"""cluster.k8s: packaging/k8s/dspkd-daemonset.yaml parses (python3-yaml) and says what
docs/cluster.md promises: one dspkd per node (a DaemonSet whose selector matches its pods),
in the foreground with the mounted configuration, the socket directory /run/dspk on a
hostPath mounted at /run/dspk, the cache on a hostPath, probes that ping the socket; the
ConfigMap's dspkd.conf parses as INI and uses only keys dspkd knows (daemon/config.c).
The socket's group: dspkd runs as uid 0 with a runAsGroup other than 0 (it creates the
socket 0660 with its own gid), and the client pod of docs/cluster.md has that gid in its
supplementalGroups and does not run as root (root pods are admins, which the page says).

    k8s_check.py SRC_DIR
"""
import configparser
import os
import re
import sys

import yaml


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    src = sys.argv[1]
    path = os.path.join(src, "packaging", "k8s", "dspkd-daemonset.yaml")
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    kinds = {d["kind"]: d for d in docs}
    check(set(kinds) == {"Namespace", "ConfigMap", "DaemonSet"}, "kinds: %s" % sorted(kinds))
    for d in docs:
        check(d.get("apiVersion") and d.get("metadata", {}).get("name"), "apiVersion, name")
    ns = kinds["Namespace"]["metadata"]["name"]
    ds = kinds["DaemonSet"]
    check(ds["apiVersion"] == "apps/v1", "DaemonSet is apps/v1")
    check(ds["metadata"]["namespace"] == ns, "DaemonSet in the namespace")
    spec = ds["spec"]
    tmpl = spec["template"]
    labels = tmpl["metadata"]["labels"]
    for k, v in spec["selector"]["matchLabels"].items():
        check(labels.get(k) == v, "selector %s=%s matches the pod labels" % (k, v))
    pod = tmpl["spec"]
    (ctr,) = pod["containers"]
    cmd = ctr["command"]
    check(cmd[0].endswith("/dspkd") and "--foreground" in cmd, "dspkd --foreground: %r" % cmd)
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    check(set(mounts) <= set(vols), "every mount has a volume")
    sock = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/run/dspk"]
    check(len(sock) == 1 and mounts[sock[0]]["mountPath"] == "/run/dspk",
          "the socket directory /run/dspk is a hostPath mounted at /run/dspk")
    check(not mounts[sock[0]].get("readOnly"), "the socket directory is writable")
    cache = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/var/cache/dspk"]
    check(len(cache) == 1, "the cache on a hostPath")
    cfgvol = [n for n, v in vols.items() if "configMap" in v]
    check(len(cfgvol) == 1 and vols[cfgvol[0]]["configMap"]["name"] ==
          kinds["ConfigMap"]["metadata"]["name"], "the ConfigMap is mounted")
    cfgdir = mounts[cfgvol[0]]["mountPath"]
    conf_arg = cmd[cmd.index("--config") + 1]
    check(os.path.dirname(conf_arg) == cfgdir and os.path.basename(conf_arg) in
          kinds["ConfigMap"]["data"], "--config names the mounted dspkd.conf")
    for probe in ("readinessProbe", "livenessProbe"):
        pc = ctr[probe]["exec"]["command"]
        check("ping" in pc and "/run/dspk/dspkd.sock" in pc, "%s pings the socket" % probe)
    # The configuration: INI, keys that daemon/config.c knows, the socket in /run/dspk.
    with open(os.path.join(src, "daemon", "config.c")) as f:
        known = set(re.findall(r'\{"(\w+)", "(\w+)", K_', f.read()))
    ini = configparser.ConfigParser()
    ini.read_string(kinds["ConfigMap"]["data"][os.path.basename(conf_arg)])
    for sec in ini.sections():
        for key in ini[sec]:
            check((sec, key) in known, "[%s] %s is a dspkd key" % (sec, key))
    check(ini["daemon"]["socket"] == "/run/dspk/dspkd.sock", "socket in the hostPath")
    # Who may connect: the socket's group is dspkd's gid; cluster.md's client pod has it.
    sc = ctr["securityContext"]
    gid = sc.get("runAsGroup")
    check(sc.get("runAsUser") == 0 and isinstance(gid, int) and gid > 0,
          "dspkd runs as uid 0 with a socket group of its own: %r" % sc)
    with open(os.path.join(src, "docs", "cluster.md")) as f:
        page = f.read()
    k8s = page[page.index("## Kubernetes"):]
    blocks = re.findall(r"```yaml\n(.*?)```", k8s, re.S)
    check(len(blocks) == 1, "cluster.md shows one client pod: %d yaml blocks" % len(blocks))
    pod_sc = yaml.safe_load(blocks[0])["spec"]["securityContext"]
    check(pod_sc.get("supplementalGroups") == [gid] and pod_sc.get("runAsNonRoot") is True and
          pod_sc.get("runAsUser", 0) != 0,
          "cluster.md's client pod: not root, the socket's gid %d: %r" % (gid, pod_sc))
    check("runAsGroup: %d" % gid in k8s and "is an admin of the\ndaemon" in k8s,
          "cluster.md names the gid and says that root pods are admins")
    print("k8s manifest: ok (%d documents)" % len(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
