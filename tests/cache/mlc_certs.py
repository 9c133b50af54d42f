"""A throwaway CA with a server (127.0.0.1) and a client certificate, made with the openssl CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def make_certs(d: Path) -> dict[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI missing: needed to make test certificates")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=sdcp-test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {k: str(d / v) for k, v in {
        "ca": "ca.pem", "server_cert": "server.pem", "server_key": "server.key",
        "client_cert": "client.pem", "client_key": "client.key"}.items()}
