"""A webhook for the alert benchmarks: answers every POST with 200 and appends one JSON line per
alert to FILE, with the time it was received (received_us, this machine's clock).

    python3 bench/webhook_sink.py PORT FILE
"""

import http.server
import json
import sys
import time

port, path = int(sys.argv[1]), sys.argv[2]


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        received = time.time_ns() // 1000
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
        alert = json.loads(body)
        alert["received_us"] = received
        with open(path, "a") as f:
            f.write(json.dumps(alert) + "\n")

    def log_message(self, *args):
        pass


open(path, "a").close()
http.server.ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()
