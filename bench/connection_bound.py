#!/usr/bin/python3
"""What one authorized client's connection can make a real lockstep-agent hold (issue 33).

    /usr/bin/python3 bench/connection_bound.py [BUILD_DIR]

Starts an agent, authorizes a CURVE client, and sends it messages no request has: many parts of
just under 4 MiB, and millions of empty parts. Prints the agent's peak resident growth while each
was sent, whether the agent cut the connection, how long it took, and what it kept afterwards. The
figures go to docs/benchmarks.md; libzmq alone would hold every part (1 GiB for the first).
"""

import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time

import zmq

BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "build")


def resident_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_agent(work):
    state = os.path.join(work, "agent")
    port = 17790
    agent = subprocess.Popen([os.path.join(BUILD, "bin", "lockstep-agent"), "--state-dir", state, "--listen",
                              f"tcp://127.0.0.1:{port}", "--name", "bench"],
                             stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "agent.err"), "w"))
    for _ in range(100):
        if os.path.exists(os.path.join(state, "agent.pub")):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    public, secret = zmq.curve_keypair()
    me = pwd.getpwuid(os.geteuid()).pw_name
    with open(os.path.join(state, "authorized_keys"), "w") as f:
        f.write(f"user={me}{' allow-root' if os.geteuid() == 0 else ''} {public.decode()} bench\n")
    os.chmod(os.path.join(state, "authorized_keys"), 0o644)
    with open(os.path.join(state, "agent.pub")) as f:
        server = f.read().strip()
    return agent, port, (public, secret, server.encode())


def send(agent, port, keys, parts, part):
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.curve_publickey, dealer.curve_secretkey, dealer.curve_serverkey = keys
    dealer.linger = 0
    monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    before = resident_kib(agent.pid)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], resident_kib(agent.pid) - before)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    dealer.connect(f"tcp://127.0.0.1:{port}")
    started = time.monotonic()
    frame = zmq.Frame(part)
    for i in range(parts):
        dealer.send(frame, zmq.SNDMORE if i + 1 < parts else 0, copy=False)
    poller = zmq.Poller()
    poller.register(monitor, zmq.POLLIN)
    poller.register(dealer, zmq.POLLIN)
    cut = False
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready = dict(poller.poll(100))
        if monitor in ready:
            cut = True
            break
        if dealer in ready:
            break
    elapsed = time.monotonic() - started
    done.set()
    watcher.join()
    time.sleep(4)  # the agent gives the heap back over 3 s
    kept = resident_kib(agent.pid) - before
    monitor.close()
    dealer.close()
    context.term()
    return peak[0] / 1024, cut, elapsed, kept / 1024


def main():
    with tempfile.TemporaryDirectory(prefix="lockstep-bench-", dir="/var/tmp") as work:
        agent, port, keys = start_agent(work)
        try:
            print(f"{'message':34} {'peak growth':>12} {'cut':>5} {'time':>8} {'kept after':>11}")
            for label, parts, part in (("256 parts of 4 MiB - 4 KiB", 256, b"x" * ((4 << 20) - 4096)),
                                       ("4,000,000 empty parts", 4_000_000, b""),
                                       ("10,000,000 empty parts", 10_000_000, b"")):
                peak, cut, elapsed, kept = send(agent, port, keys, parts, part)
                print(f"{label:34} {peak:9.0f} MiB {'yes' if cut else 'no':>5} {elapsed:6.2f} s {kept:7.0f} MiB")
        finally:
            agent.terminate()
            agent.wait(timeout=20)


if __name__ == "__main__":
    main()
