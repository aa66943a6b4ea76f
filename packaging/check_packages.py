#!/usr/bin/python3
"""Quick checks of the Debian packages (issue 8), for the test suite.

Builds both packages with cpack from a built tree into a temporary directory, then reads them back
with dpkg-deb: control fields (Depends with versions, the description of the trainer's backend),
files, conffiles, maintainer scripts, the systemd unit and the default configuration; and runs
every packaged program's --help and --version without a display.

The full install into a fresh Debian 12 is packaging/install_test.sh (minutes; not in ctest).
"""

import argparse
import os
import re
import stat
import subprocess
import sys
import tempfile

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def run(args, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def field(deb, name):
    return run(["dpkg-deb", "-f", deb, name]).strip()


def depends_entries(text):
    """'a (>= 1), b | c' -> {'a': '>= 1', 'b': None, 'c': None}"""
    entries = {}
    for group in text.split(","):
        for alternative in group.split("|"):
            m = re.fullmatch(r"\s*([a-z0-9][a-z0-9+.-]*)(?:\s*\(([^)]*)\))?\s*", alternative)
            if check(m is not None, f"unparsable dependency '{alternative}' in '{text}'"):
                entries[m.group(1)] = m.group(2)
    return entries


def files_of(deb):
    listing = run(["dpkg-deb", "-c", deb])
    files = {}
    for line in listing.splitlines():
        parts = line.split(None, 5)
        path = parts[5].split(" -> ")[0]
        files[path[2:] if path.startswith("./") else path] = parts[0]
    return files


def unit_settings(text):
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def settings_file(text):
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def check_versioned(deps, packages, deb):
    for package in packages:
        if check(package in deps, f"{deb}: Depends lacks {package}: {deps}"):
            check(deps[package] is not None and deps[package].startswith(">="),
                  f"{deb}: {package} should carry a minimum version from its shlibs, got {deps[package]}")


def check_programs(root, programs, version):
    """--help and --version of each program, as installed, with no display to talk to."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["HOME"] = os.path.join(root, "home")
    for program in programs:
        path = os.path.join(root, "usr/bin", program)
        for flag in ("--help", "--version"):
            result = subprocess.run([path, flag], capture_output=True, text=True, env=env, timeout=30)
            check(result.returncode == 0, f"{program} {flag} exited {result.returncode}: {result.stderr[-300:]}")
            if flag == "--version":
                check(result.stdout.strip() == f"{program} {version}",
                      f"{program} --version said '{result.stdout.strip()}', expected '{program} {version}'")
            else:
                check("Usage:" in result.stdout and "--version" in result.stdout,
                      f"{program} --help does not show its usage and options: {result.stdout[:200]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--cuda", required=True, choices=["0", "1"], help="1: the trainer was built with CUDA")
    parser.add_argument("--app", required=True, choices=["0", "1"], help="1: the desktop app was built")
    parser.add_argument("--man-pages", required=True, choices=["0", "1"], help="1: help2man made man pages")
    args = parser.parse_args()
    cuda, app, man_pages = args.cuda == "1", args.app == "1", args.man_pages == "1"
    args.build_dir = os.path.abspath(args.build_dir)

    with tempfile.TemporaryDirectory(prefix="lockstep-packages-") as tmp:
        out = os.path.join(tmp, "out")
        run(["cpack", "-G", "DEB", "-B", out, "--config", os.path.join(args.build_dir, "CPackConfig.cmake")],
            cwd=args.build_dir)
        version = f"{args.version}-1"
        desktop = os.path.join(out, f"lockstep_{version}_{run(['dpkg', '--print-architecture']).strip()}.deb")
        node = desktop.replace("/lockstep_", "/lockstep-agent_")
        for deb in (desktop, node):
            if not check(os.path.exists(deb), f"cpack did not make {deb}: {sorted(os.listdir(out))}"):
                raise SystemExit("\n".join(failures))

        # The desktop package.
        check(field(desktop, "Package") == "lockstep", "desktop package name")
        check(field(desktop, "Version") == version, f"desktop version {field(desktop, 'Version')}")
        deps = depends_entries(field(desktop, "Depends"))
        check_versioned(deps, ["libc6", "libstdc++6", "libzmq5", "libsodium23", "libprotobuf32", "libsqlite3-0"],
                        "lockstep")
        files = files_of(desktop)
        expected = ["usr/bin/lockstepctl"]
        if app:
            check_versioned(deps, ["libqt6core6", "libqt6widgets6", "libqt6charts6"], "lockstep")
            check("qt6-qpa-plugins" in deps, "lockstep: Depends lacks qt6-qpa-plugins (Qt's platform plugins)")
            expected += ["usr/bin/lockstep", "usr/share/applications/lockstep.desktop",
                         "usr/share/icons/hicolor/scalable/apps/lockstep.svg"]
        if man_pages:
            expected += [f"usr/share/man/man1/{p}.1.gz" for p in (["lockstep"] if app else []) + ["lockstepctl"]]
        for path in expected:
            check(path in files, f"lockstep lacks {path}")
        check(not any(p.startswith(("etc/", "lib/systemd")) for p in files), "lockstep ships node files")

        # The node package.
        check(field(node, "Package") == "lockstep-agent", "node package name")
        check(field(node, "Version") == version, f"node version {field(node, 'Version')}")
        deps = depends_entries(field(node, "Depends"))
        check_versioned(deps, ["libc6", "libstdc++6", "libzmq5", "libsodium23", "libprotobuf32", "libgloo0"],
                        "lockstep-agent")
        check("libopenblas0" in deps or any(d.startswith("libopenblas0") for d in deps),
              f"lockstep-agent: Depends lacks OpenBLAS: {deps}")
        check(not any(re.match(r"libqt6|qt6-", d) for d in deps), f"lockstep-agent depends on Qt: {deps}")
        description = field(node, "Description")
        words = " ".join(w for w in description.split() if w != ".")  # unwrapped
        if cuda:
            check("NVIDIA driver" in words and "NCCL" in words,
                  f"a CUDA build's node package must say it needs the NVIDIA driver and NCCL: {description}")
            check("libnccl2" in depends_entries(field(node, "Recommends") or "libnccl2"),
                  "a CUDA build's node package should recommend libnccl2")
        else:
            check("CPU-only" in words, f"a build without CUDA must say its trainer is CPU-only: {description}")
        for line in description.splitlines():
            check(len(line) <= 80, f"description line over 80 columns: '{line}'")
        files = files_of(node)
        unit = "lib/systemd/system/lockstep-agent.service"
        expected = ["usr/bin/lockstep-agent", "usr/bin/lockstep-trainer", unit,
                    "etc/lockstep/agent.conf", "etc/lockstep/authorized_keys",
                    # Issue 13: what a user's own program reports its steps with.
                    "usr/lib/lockstep/python/lockstep/__init__.py",
                    "usr/lib/lockstep/python/lockstep/v1/lockstep_pb2.py",
                    "usr/lib/python3/dist-packages/lockstep.pth",
                    # Issue 32: the progress record and stacks, also for scripts that never import lockstep.
                    "usr/lib/lockstep/python/lockstep/_progress.py",
                    "usr/lib/lockstep/python/lockstep/_record.abi3.so",
                    "usr/lib/lockstep/python/boot/sitecustomize.py",
                    "usr/include/lockstep/reporter.h", "usr/lib/liblockstep-reporter.so.0",
                    "usr/lib/liblockstep-reporter.so"]
        if man_pages:
            expected += ["usr/share/man/man1/lockstep-agent.1.gz", "usr/share/man/man1/lockstep-trainer.1.gz"]
        for path in expected:
            check(path in files, f"lockstep-agent lacks {path}")
        check(not any("lockstepctl" in p or p.endswith("bin/lockstep") for p in files), "lockstep-agent ships desktop files")
        check(not any("__pycache__" in p for p in files), "lockstep-agent ships Python bytecode caches")
        check(not any(p.startswith("usr/lib/python3/dist-packages/lockstep/") for p in files),
              "the lockstep package must not be in dist-packages: the agent puts its directory on PYTHONPATH")
        check(not any(p.endswith("sitecustomize.py") and p != "usr/lib/lockstep/python/boot/sitecustomize.py"
                      for p in files),
              "a sitecustomize.py outside usr/lib/lockstep/python/boot would run in every Python on the node")
        recommends = depends_entries(field(node, "Recommends") or "")
        for package in ("python3-zmq", "python3-protobuf"):
            check(package in recommends, f"lockstep-agent should recommend {package} (the lockstep package reports with it)")

        control = os.path.join(tmp, "control")
        run(["dpkg-deb", "-e", node, control])
        with open(os.path.join(control, "conffiles")) as f:
            conffiles = f.read().split()
        check(sorted(conffiles) == ["/etc/lockstep/agent.conf", "/etc/lockstep/authorized_keys"],
              f"conffiles: {conffiles}")
        for script in ("postinst", "prerm", "postrm"):
            path = os.path.join(control, script)
            if check(os.path.exists(path), f"lockstep-agent has no {script}"):
                check(os.stat(path).st_mode & stat.S_IXUSR, f"{script} is not executable")
                check(subprocess.run(["sh", "-n", path]).returncode == 0, f"{script} is not valid sh")
        with open(os.path.join(control, "postinst")) as f:
            postinst = f.read()
        check("chown -R root:root" in postinst, "postinst does not hand an older install's state to root")
        check("deb-systemd-helper" in postinst and "enable" in postinst, "postinst does not enable the unit")

        root = os.path.join(tmp, "root")
        for deb in (desktop, node):
            run(["dpkg-deb", "-x", deb, root])
        with open(os.path.join(root, unit)) as f:
            settings = unit_settings(f.read())
        exec_start = settings.get("ExecStart", [""])[0].split()
        check(exec_start[:1] == ["/usr/bin/lockstep-agent"], f"ExecStart: {exec_start}")
        check(exec_start[1:] == ["--config", "/etc/lockstep/agent.conf"], f"ExecStart's arguments: {exec_start}")
        # Root, with no more capabilities than running jobs as their users takes (docs/security.md).
        check("User" not in settings, f"the unit's User= {settings.get('User')}: the agent runs jobs as their users as root")
        caps = set(" ".join(settings.get("CapabilityBoundingSet", [])).split())
        check({"CAP_SETUID", "CAP_SETGID", "CAP_SYS_ADMIN"} <= caps and "CAP_NET_ADMIN" not in caps and "CAP_SYS_MODULE" not in caps,
              f"CapabilityBoundingSet={sorted(caps)}")
        check("mnt" in " ".join(settings.get("RestrictNamespaces", ["mnt pid"])) and
              "pid" in " ".join(settings.get("RestrictNamespaces", ["mnt pid"])),
              "RestrictNamespaces= forbids the jobs' mount and PID namespaces")
        check(settings.get("StateDirectory") == ["lockstep-agent"], "the unit has no StateDirectory=lockstep-agent")
        check(settings.get("KillMode") == ["process"], "KillMode=process keeps jobs running across agent restarts")
        nice = settings.get("LimitNICE", ["0"])[0]
        check(nice.isdigit() and int(nice) >= 20,
              f"LimitNICE={nice}: the trainer needs RLIMIT_NICE >= 20 to leave SCHED_IDLE (ARCHITECTURE.md)")
        check("PrivateDevices" not in settings, "PrivateDevices= would hide the GPUs")
        check(settings.get("WantedBy") == ["multi-user.target"], "the unit is not wanted by multi-user.target")

        with open(os.path.join(root, "etc/lockstep/agent.conf")) as f:
            conf = settings_file(f.read())
        check(re.fullmatch(r"tcp://127\.0\.0\.1:\d+", conf.get("listen", "")), f"agent.conf listens beyond loopback: {conf}")
        check(conf.get("authorized-keys") == "/etc/lockstep/authorized_keys", f"agent.conf authorized-keys: {conf}")
        check(conf.get("state-dir") == "/var/lib/lockstep-agent", f"agent.conf state-dir (StateDirectory=): {conf}")
        with open(os.path.join(root, "etc/lockstep/authorized_keys")) as f:
            keys = [line for line in f.read().splitlines() if line.strip() and not line.startswith("#")]
        check(keys == [], f"the packaged authorized_keys must authorize nobody: {keys}")
        # The packaged agent reads the packaged settings (flags win: the state goes to a temp dir).
        state = os.path.join(tmp, "state")
        result = subprocess.run([os.path.join(root, "usr/bin/lockstep-agent"), "--config",
                                 os.path.join(root, "etc/lockstep/agent.conf"), "--state-dir", state, "--print-key"],
                                capture_output=True, text=True, timeout=30)
        check(result.returncode == 0 and len(result.stdout.strip()) == 40,
              f"the agent does not take its packaged agent.conf: {result.stderr}")

        if app:
            with open(os.path.join(root, "usr/share/applications/lockstep.desktop")) as f:
                entry = settings_file(f.read().replace("[Desktop Entry]", ""))
            check(entry.get("Exec", "").split()[:1] == ["lockstep"] and entry.get("Icon") == "lockstep",
                  f"desktop entry: {entry}")
            validate = "/usr/bin/desktop-file-validate"
            if os.path.exists(validate):
                result = subprocess.run([validate, os.path.join(root, "usr/share/applications/lockstep.desktop")],
                                        capture_output=True, text=True)
                check(result.returncode == 0, f"desktop-file-validate: {result.stdout}{result.stderr}")

        # The packaged Python package imports with Debian's Python and its packages.
        with open(os.path.join(root, "usr/lib/python3/dist-packages/lockstep.pth")) as f:
            check(f.read().strip() == "/usr/lib/lockstep/python", "lockstep.pth must name /usr/lib/lockstep/python")
        result = subprocess.run(["/usr/bin/python3", "-c", "import lockstep, lockstep.v1.lockstep_pb2; print(lockstep.active())"],
                                capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, PYTHONPATH=os.path.join(root, "usr/lib/lockstep/python")))
        check(result.returncode == 0 and result.stdout.strip() == "False",
              f"the packaged lockstep Python package does not import: {result.stderr[-500:]}")

        check_programs(root, ["lockstepctl"] + (["lockstep"] if app else []), args.version)
        check_programs(root, ["lockstep-agent", "lockstep-trainer"], args.version)

    if failures:
        print("package checks failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("packages look right")
    return 0


if __name__ == "__main__":
    sys.exit(main())
