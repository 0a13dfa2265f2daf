"""TLS on every link (real processes and sockets, a CA made per test run with trustme):
mutual-TLS replication converges; a plaintext peer, a self-signed peer, a peer without a
certificate and one with a certificate from another CA get no frame while the root keeps
serving, and are counted; a replica does not follow a source its CA did not sign; SIGHUP
rotates the certificates of new connections."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from net import certs
from net.metrics import not_after
from net.tlsconf import TlsContexts, TlsFiles
from replicator import frames
from testkit import metrics
from testkit.procs import Procs, free_port, run_mercury
from testkit.replication import RootNode, contents, items, wait_for


@dataclass
class Pki:
    ca: trustme.CA
    ca_file: Path
    dir: Path

    def issue(
        self, name: str, ca: trustme.CA | None = None, role: str | None = "replica"
    ) -> TlsFiles:
        """A leaf certificate for 127.0.0.1 signed by `ca` (default: ours) carrying
        `role` (`mercury certs`' role URI; None: no role, as before roles), as files."""
        cert, key = self.dir / f"{name}.crt", self.dir / f"{name}.key"
        signer = ca or self.ca
        if role is None:
            leaf = signer.issue_cert("127.0.0.1", "localhost")
            cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
            leaf.private_key_pem.write_to_path(str(key))
        else:
            ca_cert = x509.load_pem_x509_certificate(signer.cert_pem.bytes())
            ca_key = serialization.load_pem_private_key(signer.private_key_pem.bytes(), None)
            assert isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey)
            made, made_key = certs.node_cert(name, role, [], ca_cert, ca_key)
            cert.write_bytes(made.public_bytes(serialization.Encoding.PEM))
            key.write_bytes(certs.key_pem(made_key))
        return TlsFiles(cert=str(cert), key=str(key), ca=str(self.ca_file))


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    d = tmp_path / "pki"
    d.mkdir()
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.crt"))
    return Pki(ca, d / "ca.crt", d)


def tls_flags(files: TlsFiles) -> list[str]:
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]


def https(files: TlsFiles) -> httpx.Client:
    """An HTTPS client trusting our CA only."""
    return httpx.Client(verify=ssl.create_default_context(cafile=files.ca), timeout=5)


def wait_https(
    url: str, files: TlsFiles, proc: subprocess.Popen[bytes], timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    with https(files) as c:
        while time.monotonic() < deadline:
            assert proc.poll() is None, "process exited"
            try:
                if c.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise TimeoutError(url)


def _hello() -> bytes:
    return frames.encode_hello(
        frames.Hello(
            frames.PROTOCOL_VERSION, frames.MODE_STREAM, frames.OPT_NEWEST_ONLY,
            uuid.uuid4().bytes, frames.ZERO_ID, 0, 0, 0, frames.ZERO_SHA,
        )
    )  # fmt: skip


def _client_ctx(files: TlsFiles | None, trust: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=trust)
    if files is not None:
        ctx.load_cert_chain(files.cert, files.key)
    return ctx


def first_bytes(port: int, ctx: ssl.SSLContext | None) -> bytes:
    """Connect (TLS with `ctx`, else plaintext), send a HELLO, return what comes back
    (b"" when the source closed without a frame or the handshake failed)."""
    with socket.create_connection(("127.0.0.1", port), 5) as raw:
        raw.settimeout(10)
        try:
            if ctx is None:
                raw.sendall(_hello())
                return raw.recv(frames.HEADER_SIZE)
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(_hello())
                return s.recv(frames.HEADER_SIZE)
        except (ssl.SSLError, ConnectionError):
            return b""


def peer_cert(port: int, trust: str, files: TlsFiles | None = None) -> bytes:
    """The DER certificate a TLS listener presents to a new connection."""
    with socket.create_connection(("127.0.0.1", port), 5) as raw:
        raw.settimeout(10)
        with _client_ctx(files, trust).wrap_socket(raw, server_hostname="127.0.0.1") as s:
            der = s.getpeercert(binary_form=True)
            assert der is not None
            return der


def _der(pem_file: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(
        Path(pem_file).read_text().split("-----END CERTIFICATE-----")[0]
        + "-----END CERTIFICATE-----\n"
    )


def _metric(text: str, reason: str) -> float:
    return metrics.value(text, "mercury_repl_refused_total", reason=reason)


def start_root(
    procs: Procs, tmp_path: Path, files: TlsFiles
) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    p = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen", f"127.0.0.1:{repl}",
        *tls_flags(files), name="root",
    )  # fmt: skip
    wait_https(f"https://127.0.0.1:{gw}/healthz", files, p)
    return p, gw, repl, data


def start_tls_replica(
    procs: Procs, data: Path, source: int, files: TlsFiles, name: str, repl: bool = True
) -> tuple[subprocess.Popen[bytes], int, int]:
    http, rport = free_port(), free_port()
    args = ["replica", str(data), "--listen", f"127.0.0.1:{http}", "--source",
            f"127.0.0.1:{source}", *tls_flags(files)]  # fmt: skip
    if repl:
        args += ["--repl-listen", f"127.0.0.1:{rport}"]
    p = procs.start_mercury(*args, name=name)
    return p, http, rport


def test_mutual_tls_replication_converges_through_a_tree(
    tmp_path: Path, procs: Procs, pki: Pki
) -> None:
    root_files = pki.issue("root")
    root = RootNode(str(tmp_path / "root"), tls=TlsContexts(root_files))
    try:
        root.write(500)
        r1, h1, rp1 = start_tls_replica(procs, tmp_path / "r1", root.port, pki.issue("r1"), "r1")
        wait_https(f"https://127.0.0.1:{h1}/healthz", root_files, r1)
        r2, h2, _ = start_tls_replica(
            procs, tmp_path / "r2", rp1, pki.issue("r2"), "r2", repl=False
        )  # bootstraps and streams from r1 over mutual TLS
        wait_https(f"https://127.0.0.1:{h2}/healthz", root_files, r2)
        root.write(300, start=500)
        seq = root.store.last_seq()
        with https(root_files) as c:
            for port in (h1, h2):

                def caught_up(p: int = port) -> bool:
                    return bool(c.get(f"https://127.0.0.1:{p}/v1/status").json()["seq"] >= seq)

                wait_for(caught_up, 60, f"seq {seq} on {port}")
            got = c.get(f"https://127.0.0.1:{h2}/v1/kv/k00000700")
            assert got.status_code == 200 and got.content == b"v700-700"
            # A replica's source (in its worker) refuses a plaintext peer too; the
            # replica's /metrics counts it.
            assert first_bytes(rp1, None) == b""

            def counted() -> bool:
                text = c.get(f"https://127.0.0.1:{h1}/metrics").text
                return _metric(text, "plaintext") == 1

            wait_for(counted, 20, "the replica's refusal counted")
        # Plain HTTP on a TLS listener is not served.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{h1}/healthz", timeout=3)
        for p in (r1, r2):
            procs.terminate(p)
        expect = items(root.store)
        assert contents(str(tmp_path / "r1")) == expect
        assert contents(str(tmp_path / "r2")) == expect
    finally:
        root.close()


def test_untrusted_peers_get_no_frame_and_the_root_keeps_serving(
    tmp_path: Path, procs: Procs, pki: Pki
) -> None:
    files = pki.issue("root")
    root, gw, repl, _ = start_root(procs, tmp_path, files)
    other_ca = trustme.CA()
    foreign = pki.issue("foreign", other_ca)
    self_signed_dir = tmp_path / "selfsigned"
    self_signed_dir.mkdir()
    lone = trustme.CA()  # a CA certificate is self-signed: present it as a leaf
    lone.cert_pem.write_to_path(str(self_signed_dir / "c.pem"))
    lone.private_key_pem.write_to_path(str(self_signed_dir / "k.pem"))
    self_signed = TlsFiles(str(self_signed_dir / "c.pem"), str(self_signed_dir / "k.pem"), files.ca)

    assert first_bytes(repl, None) == b""  # plaintext HELLO
    assert first_bytes(repl, _client_ctx(None, files.ca)) == b""  # TLS, no certificate
    assert first_bytes(repl, _client_ctx(self_signed, files.ca)) == b""
    assert first_bytes(repl, _client_ctx(foreign, files.ca)) == b""
    # The trusted peer is served (a WELCOME or a refusal of its made-up db id: a frame).
    good = first_bytes(repl, _client_ctx(pki.issue("good"), files.ca))
    assert good[:1] in (bytes([frames.WELCOME]), bytes([frames.REFUSE]))
    assert root.poll() is None
    with https(files) as c:
        assert c.get(f"https://127.0.0.1:{gw}/healthz").status_code == 200
        metrics = c.get(f"https://127.0.0.1:{gw}/metrics").text
    assert _metric(metrics, "plaintext") == 1
    assert _metric(metrics, "no_certificate") == 1
    assert _metric(metrics, "untrusted_certificate") == 2  # self-signed, other CA
    assert "TLS handshake failed (no_certificate" in procs.logs()


def test_a_replica_does_not_follow_a_source_from_another_ca(
    tmp_path: Path, procs: Procs, pki: Pki
) -> None:
    other = trustme.CA()
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other.cert_pem.write_to_path(str(other_dir / "ca.crt"))
    imposter = Pki(other, other_dir / "ca.crt", other_dir).issue("imposter")
    root = RootNode(str(tmp_path / "root"), tls=TlsContexts(imposter))
    try:
        root.write(10)
        r, _http, _ = start_tls_replica(procs, tmp_path / "r", root.port, pki.issue("r"), "r")

        # Until three attempts are logged (a loaded machine can take seconds to start a
        # process): the first, and retries after it.
        def refusals() -> int:
            logs = [f.read_text(errors="replace") for f in procs.log_dir.glob("r-*.log")]
            return sum(text.count("certificate verify failed") for text in logs)

        wait_for(lambda: refusals() >= 3, 60, "refused attempts")
        # It never got a snapshot: no store, still bootstrapping, the failure logged.
        assert r.poll() is None
        assert not (tmp_path / "r" / "data.mdb").exists()
        assert "certificate verify failed" in procs.logs()
    finally:
        root.close()


def test_sighup_rotates_certificates_for_new_connections(
    tmp_path: Path, procs: Procs, pki: Pki
) -> None:
    files = pki.issue("root")
    root, gw, repl, _ = start_root(procs, tmp_path, files)
    before_http = peer_cert(gw, files.ca)
    before_repl = peer_cert(repl, files.ca, pki.issue("client"))
    assert before_http == before_repl == _der(files.cert)
    new = pki.issue("root-next")
    os.replace(new.cert, files.cert)
    os.replace(new.key, files.key)
    os.kill(root.pid, signal.SIGHUP)
    wait_for(lambda: peer_cert(gw, files.ca) != before_http, 20, "new HTTPS certificate")
    wait_for(
        lambda: peer_cert(repl, files.ca, pki.issue("client2")) != before_repl,
        20,
        "new replication certificate",
    )
    assert peer_cert(gw, files.ca) == _der(files.cert)
    assert root.poll() is None
    # The expiry the certificate alert watches is the file's, read at scrape time.
    with https(files) as c:
        text = c.get(f"https://127.0.0.1:{gw}/metrics").text
    expiry = metrics.value(text, "mercury_tls_cert_expiry_timestamp_seconds", cert="node")
    assert expiry == not_after(files.cert) and expiry > time.time()
    # A CA change on the replication link: peers of the old CA are refused from now on.
    next_ca = trustme.CA()
    next_ca.cert_pem.write_to_path(files.ca)
    rotated = Pki(next_ca, Path(files.ca), pki.dir).issue("root-ca2")
    os.replace(rotated.cert, files.cert)
    os.replace(rotated.key, files.key)
    os.kill(root.pid, signal.SIGHUP)
    old_peer = _client_ctx(pki.issue("old-ca-client"), files.ca)
    wait_for(lambda: first_bytes(repl, old_peer) == b"", 20, "old-CA peer refused")
    new_peer = _client_ctx(Pki(next_ca, Path(files.ca), pki.dir).issue("new-client"), files.ca)
    assert first_bytes(repl, new_peer)[:1] in (bytes([frames.WELCOME]), bytes([frames.REFUSE]))
