"""A throwaway CA with a server (127.0.0.1) and client certificates, made with the openssl CLI.

Client certificates carry the identity scheme of sdcp_fast.protocol.peer: a base URI
and a role URN as URI SANs. ``client`` is a drafter (the name older tests use); the others
are named for what they are.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# name -> URI SANs
CLIENTS: dict[str, tuple[str, ...]] = {
    "client": ("https://drafter-a.test:8443/", "urn:sdcp:role:drafter"),
    "drafter2": ("https://drafter-b.test:8443/", "urn:sdcp:role:drafter"),
    "verifier": ("https://verifier.test:8443/", "urn:sdcp:role:verifier"),
    "router": ("https://router.test:8443/", "urn:sdcp:role:router"),
    "reader": ("https://frontend.test:8443/", "urn:sdcp:role:client"),
    "norole": ("https://anyone.test:8443/",),
}


def make_certs(d: Path) -> dict[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI missing: needed to make test certificates")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=sdcp-test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    exts = {"server": "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"}
    for name, uris in CLIENTS.items():
        exts[name] = "subjectAltName=" + ",".join(f"URI:{u}" for u in uris) + "\nextendedKeyUsage=clientAuth"
    out = {"ca": str(d / "ca.pem")}
    for name, ext in exts.items():
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
        out[f"{name}_cert"], out[f"{name}_key"] = str(d / f"{name}.pem"), str(d / f"{name}.key")
    return out
