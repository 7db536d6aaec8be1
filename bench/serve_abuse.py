#!/usr/bin/python3
"""`specula serve` under abuse, against the targets of docs/serving.md ("Security and limits").

Starts `specula serve MODEL --port 0 --parallel 4` and measures, on loopback:

  idle      N idle connections held open (default 1000): GET /health p99 (target < 50 ms) on fresh
            connections, and one completion's decode rate held against the same completion without them.
  streams   200 concurrent streaming clients on 4 slots: each served to `data: [DONE]` or refused with 429
            (with Retry-After), none hangs; specula:num_requests_running back to 0 after; /health timed
            every 20 ms meanwhile.
  memory    the server's resident memory over 1000 requests, a third of them abusive (100,000-deep JSON,
            a 1e400 temperature, bodies past the limit chunked and with a huge Content-Length, a header
            past its limit, clients that leave mid-answer, slow senders); growth target < 64 MiB.

The client raises its own open-file limit for the idle connections (the server raises its own; both
print what `ulimit -n` allowed). Not a unit test: a benchmark to run by hand, about two minutes.

    bench/serve_abuse.py --model models/specula-tiny-kjv-q8_0.gguf [--json]
"""
import argparse
import http.client
import json
import re
import resource
import socket
import subprocess
import sys
import threading
import time

PROMPT = "And God said, Let there be light"


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return soft, hard, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1


def percentile(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class Server:
    def __init__(self, specula, model, extra):
        cmd = [specula, "serve", model, "--port", "0", "--parallel", "4", "-q"] + extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        m = re.search(r"http://([^:]+):(\d+)", self.proc.stdout.readline())
        if not m:
            sys.exit(f"serve_abuse: {' '.join(cmd)} printed no address")
        self.host, self.port = m.group(1), int(m.group(2))
        for _ in range(600):
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        sys.exit("serve_abuse: the server did not become ready")

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, timeout=10):
        c = self.conn(timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path, body, timeout=120, headers=None):
        c = self.conn(timeout)
        try:
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body), headers=h)
            r = c.getresponse()
            return r.status, r.read(), r.getheader("Retry-After")
        finally:
            c.close()

    def metric(self, name):
        text = self.get("/metrics")[1].decode()
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def raw(self, data, read=True, timeout=30):
        """Sends raw bytes on a fresh connection; returns the status line's code (or None)."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            s.sendall(data)
            if not read:
                return None
            reply = s.recv(4096).decode(errors="replace")
            m = re.match(r"HTTP/1\.\d (\d+)", reply)
            return int(m.group(1)) if m else None
        except OSError:
            return None
        finally:
            s.close()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def completion_rate(server, tokens=128):
    body = {"prompt": PROMPT, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    t0 = time.perf_counter()
    status, data, _ = server.post("/v1/completions", body)
    dt = time.perf_counter() - t0
    if status != 200:
        return None
    return json.loads(data)["usage"]["completion_tokens"] / dt


def health_latencies(server, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        status, _ = server.get("/health", timeout=10)
        out.append((time.perf_counter() - t0) * 1000 if status == 200 else float("inf"))
    return out


def bench_idle(server, count, probes):
    def hold():
        return [socket.create_connection((server.host, server.port), timeout=10) for _ in range(count)]

    # The completion's rate alone and with the idle connections held, alternately (the machine's own
    # noise is larger than any difference).
    alone, during = [], []
    for _ in range(3):
        alone += [completion_rate(server) or 0 for _ in range(3)]
        held = hold()
        time.sleep(0.3)
        during += [completion_rate(server) or 0 for _ in range(3)]
        for s in held:
            s.close()
        time.sleep(0.3)
    held = hold()
    time.sleep(0.5)
    conns = server.metric("specula:http_connections")
    lat = health_latencies(server, probes)
    # Half-sent headers as well (slow senders), for the last probes.
    slow = []
    for _ in range(min(100, count // 10)):
        s = socket.create_connection((server.host, server.port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    lat_slow = health_latencies(server, probes // 2)
    for s in held + slow:
        s.close()
    return {"idle_connections": count, "connections_open_seen_by_server": conns, "health_probes": len(lat),
            "health_p50_ms": percentile(lat, 50), "health_p99_ms": percentile(lat, 99), "health_max_ms": max(lat),
            "health_p99_ms_with_slow_senders": percentile(lat_slow, 99),
            "completion_tok_s_alone_median": percentile(alone, 50),
            "completion_tok_s_with_idle_median": percentile(during, 50),
            "target_met": percentile(lat, 99) < 50 and all(during)}


def bench_streams(server, clients, tokens):
    results = []
    lock = threading.Lock()

    def client(i):
        body = {"prompt": f"{i} {PROMPT}", "max_tokens": tokens, "min_tokens": tokens, "temperature": 0, "stream": True}
        outcome = "hang"
        try:
            c = server.conn(timeout=300)
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 429:
                outcome = "429" if r.getheader("Retry-After") else "429-without-retry-after"
                r.read()
            elif r.status == 200:
                data = r.read().decode()
                outcome = "served" if data.rstrip().endswith("data: [DONE]") and '"error"' not in data else "broken"
            else:
                outcome = f"status-{r.status}"
            c.close()
        except Exception as e:  # a timeout is the hang this measures
            outcome = f"hang ({type(e).__name__})"
        with lock:
            results.append(outcome)

    probes = []
    done = threading.Event()

    def prober():
        while not done.is_set():
            probes.extend(health_latencies(server, 1))
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    probe = threading.Thread(target=prober)
    t0 = time.perf_counter()
    probe.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    done.set()
    probe.join()
    time.sleep(0.5)
    counts = {k: results.count(k) for k in sorted(set(results))}
    running = server.metric("specula:num_requests_running")
    waiting = server.metric("specula:num_requests_waiting")
    ok = counts.get("served", 0) + counts.get("429", 0) == clients and running == 0 and waiting == 0
    return {"clients": clients, "outcomes": counts, "seconds": elapsed, "running_after": running,
            "waiting_after": waiting, "health_probes_meanwhile": len(probes),
            "health_p99_ms_meanwhile": percentile(probes, 99) if probes else None, "target_met": ok}


def abusive(server, kind):
    host = f"Host: {server.host}\r\n".encode()
    if kind == "nested":
        body = '{"prompt": "x", "temperature": ' + "[" * 100000 + "]" * 100000 + "}"
        return server.post("/v1/completions", body)[0] == 400
    if kind == "overflow":
        return server.post("/v1/completions", '{"prompt": "x", "temperature": 1e400}')[0] == 400
    if kind == "chunked":
        s = socket.create_connection((server.host, server.port), timeout=30)
        try:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + host +
                      b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            piece = b"x" * (1 << 16)
            chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            for _ in range(128):  # 8 MiB, past the 4 MiB limit
                s.sendall(chunk)
        except OSError:
            pass  # the server answered 413 and closed
        try:
            reply = s.recv(4096).decode(errors="replace")
        except OSError:
            reply = ""
        s.close()
        return " 413 " in reply
    if kind == "huge-length":
        return server.raw(b"POST /v1/completions HTTP/1.1\r\n" + host +
                          b"Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n{") == 413
    if kind == "header":
        return server.raw(b"GET /health HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * 40000 + b"\r\n\r\n") == 431
    if kind == "leave":
        s = socket.create_connection((server.host, server.port), timeout=30)
        body = json.dumps({"prompt": PROMPT, "max_tokens": 64, "min_tokens": 64, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n" + host + b"Content-Type: application/json\r\n" +
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        s.recv(512)
        s.close()
        return True
    if kind == "slow":
        s = socket.create_connection((server.host, server.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\n")
        s.close()
        return True
    raise ValueError(kind)


def bench_memory(server, total):
    kinds = ["nested", "overflow", "chunked", "huge-length", "header", "leave", "slow"]
    for _ in range(20):  # warm: every slot used, every path taken once
        server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    for k in kinds:
        abusive(server, k)
    start = rss_mib(server.proc.pid)
    peak = start
    failures = []
    for i in range(total):
        if i % 3 == 2:
            kind = kinds[(i // 3) % len(kinds)]
            if not abusive(server, kind):
                failures.append(kind)
        else:
            body = {"prompt": f"{i} {PROMPT}", "max_tokens": 8, "temperature": 1.0}
            status = server.post("/v1/completions", body)[0]
            if status != 200:
                failures.append(f"plain request: {status}")
        if i % 50 == 0:
            peak = max(peak, rss_mib(server.proc.pid))
    time.sleep(1)
    end = rss_mib(server.proc.pid)
    return {"requests": total, "rss_start_mib": start, "rss_end_mib": end, "rss_peak_mib": max(peak, end),
            "growth_mib": end - start, "unexpected_answers": failures[:10], "unexpected_count": len(failures),
            "target_met": end - start < 64 and not failures}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/specula-tiny-kjv-q8_0.gguf")
    ap.add_argument("--specula", default="build/bin/specula")
    ap.add_argument("--idle", type=int, default=1000, help="idle connections to hold")
    ap.add_argument("--probes", type=int, default=400, help="/health probes timed")
    ap.add_argument("--clients", type=int, default=200, help="concurrent streaming clients")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per streamed request")
    ap.add_argument("--requests", type=int, default=1000, help="requests of the memory run")
    ap.add_argument("--only", default="idle,streams,memory")
    ap.add_argument("--extra", default="", help="more arguments for specula serve")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    soft, hard, now = raise_fd_limit(a.idle + 256)
    out = {"client_fd_limit": {"soft_before": soft, "hard": hard, "soft_now": now}}
    server = Server(a.specula, a.model, ["--max-connections", str(a.idle + 200)] + a.extra.split())
    try:
        with open(f"/proc/{server.proc.pid}/limits") as f:
            out["server_fd_limit"] = next(l.split()[3:5] for l in f if l.startswith("Max open files"))
        only = a.only.split(",")
        if "idle" in only:
            out["idle"] = bench_idle(server, a.idle, a.probes)
        if "streams" in only:
            out["streams"] = bench_streams(server, a.clients, a.tokens)
        if "memory" in only:
            out["memory"] = bench_memory(server, a.requests)
        out["server_threads"] = len(__import__("os").listdir(f"/proc/{server.proc.pid}/task"))
    finally:
        server.stop()
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k}: {json.dumps(v)}")
    sys.exit(0 if all(v.get("target_met", True) for v in out.values() if isinstance(v, dict)) else 1)


if __name__ == "__main__":
    main()
