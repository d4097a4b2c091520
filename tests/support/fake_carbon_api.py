"""A fake grid-intensity API of the Electricity Maps shape for tests/carbon.rs: HTTPS on
127.0.0.1 (a free port, written to PORT_FILE) answering
`/v3/carbon-intensity/history?zone=Z` with the points of HISTORY_JSON
(`[[unix_ns, g_per_kwh], ...]`, times to the nanosecond) and `/v3/carbon-intensity/latest?zone=Z` with the
last of them, to requests carrying `auth-token: <TOKEN>` (401 otherwise, 404 elsewhere).

MODE `ok` answers as above; `garbage` answers 200 with bytes that are not JSON; `slow`
waits 30 s before answering. Logs one line per request to stderr.

usage: fake_carbon_api.py CERT KEY TOKEN MODE HISTORY_JSON PORT_FILE
"""
import datetime
import http.server
import json
import os
import socketserver
import ssl
import sys
import time

cert, key, token, mode, history_file, port_file = sys.argv[1:7]
points = json.load(open(history_file))


def iso(t_ns):
    d = datetime.datetime.fromtimestamp(t_ns // 10**9, datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + ".%09dZ" % (t_ns % 10**9)


def point(zone, t, g):
    return {"zone": zone, "carbonIntensity": g, "datetime": iso(t),
            "updatedAt": iso(t), "isEstimated": False}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        path, _, query = self.path.partition("?")
        zone = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("zone", "")
        if self.headers.get("auth-token") != token:
            self.send_response(401)
            self.end_headers()
            return
        if mode == "slow":
            time.sleep(30)
        if path == "/v3/carbon-intensity/history":
            body = {"zone": zone, "history": [point(zone, t, g) for t, g in points]}
        elif path == "/v3/carbon-intensity/latest":
            t, g = points[-1]
            body = point(zone, t, g)
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = b"<html>upstream error</html>\x00\xff" if mode == "garbage" else json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


server = Server(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
