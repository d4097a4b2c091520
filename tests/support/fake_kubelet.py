"""A fake kubelet for tests/k8s.rs: HTTPS on 127.0.0.1 (a free port, written to PORT_FILE),
serving the recorded pod list in PODS_JSON at /pods to requests carrying
`Authorization: Bearer <TOKEN>`; 401 otherwise, 404 elsewhere. Logs one line per request
to stderr.

usage: fake_kubelet.py CERT KEY TOKEN PODS_JSON PORT_FILE
"""
import http.server
import ssl
import sys

cert, key, token, pods, port_file = sys.argv[1:6]
body = open(pods, "rb").read()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.split("?")[0] != "/pods":
            self.send_response(404)
            self.end_headers()
            return
        if self.headers.get("Authorization") != "Bearer " + token:
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os

os.rename(port_file + ".tmp", port_file)
server.serve_forever()
