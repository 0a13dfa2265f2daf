"""Certificate roles on real processes, with certificates `mercury certs` makes per run:
a consumer's certificate, though signed by the deployment's CA, neither pulls the data set
(stream or snapshot) from a source nor serves as one to a replica; a certificate without a
role is refused on both ends unless --tls-allow-roleless (then each such peer is logged);
root and replica certificates replicate; a consumer's certificate reads over HTTPS with its
read token."""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
import time
import uuid
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ha.leader import LeaderGate
from net import certs
from net.tlsconf import PeerRoleError, TlsContexts, TlsFiles
from replicator import frames, upstream
from replicator.tcp import TcpTransport
from replicator.transport import Link
from testkit import metrics
from testkit.procs import Procs, free_port, run_mercury
from testkit.replication import RootNode, contents, items, wait_for
from tests.security.test_tls import https, start_tls_replica, tls_flags, wait_https


def _certs(d: Path) -> dict[str, TlsFiles]:
    """root, r1 (replica), r2 (replica), c1 (consumer) from `mercury certs`, plus two made
    by hand with the same CA: "legacy", without a role (as `mercury certs` made before
    roles), and "c1-server", the consumer's role with server usage too (as another PKI
    might issue it: only the role check, not the key usage, refuses it as a source)."""
    res = run_mercury(
        "certs", str(d), "--node", "root", "--role", "root", "--node", "r1", "--role",
        "replica", "--node", "r2", "--role", "replica", "--node", "c1", "--role", "consumer",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    both = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    for name, names in (
        ("legacy", [x509.DNSName("localhost")]),
        ("c1-server", [x509.UniformResourceIdentifier("urn:mercury:role:consumer")]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(both, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (d / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{name}.key").write_bytes(certs.key_pem(key))
    return {
        n: TlsFiles(str(d / f"{n}.crt"), str(d / f"{n}.key"), str(d / "ca.crt"))
        for n in ("root", "r1", "r2", "c1", "legacy", "c1-server")
    }


def _hello(mode: int) -> bytes:
    return frames.encode_hello(
        frames.Hello(
            frames.PROTOCOL_VERSION, mode, frames.OPT_NEWEST_ONLY, uuid.uuid4().bytes,
            frames.ZERO_ID, 0, 0, 0, frames.ZERO_SHA,
        )
    )  # fmt: skip


def _first_bytes(port: int, files: TlsFiles, mode: int) -> bytes:
    """Connect with `files`' certificate, send a HELLO asking for `mode`, return what
    comes back (b"": closed without a frame)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=files.ca)
    ctx.load_cert_chain(files.cert, files.key)
    with socket.create_connection(("127.0.0.1", port), 5) as raw:
        raw.settimeout(10)
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                s.sendall(_hello(mode))
                return s.recv(frames.HEADER_SIZE)
        except (ssl.SSLError, ConnectionError):
            return b""


def _refused(text: str, reason: str) -> float:
    return metrics.value(text, "mercury_repl_refused_total", reason=reason)


def test_only_root_and_replica_certificates_pull_from_a_source(
    tmp_path: Path, procs: Procs
) -> None:
    pki = _certs(tmp_path / "certs")
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen", f"127.0.0.1:{repl}",
        "--read-auth", *tls_flags(pki["root"]), name="root",
    )  # fmt: skip
    base = f"https://127.0.0.1:{gw}"
    wait_https(f"{base}/healthz", pki["root"], root)
    admin = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
    with https(pki["root"]) as c:
        assert c.put(f"{base}/v1/admin/producers/p", json={"keyspaces": ["app/"]}, headers=admin)
        ptok = c.post(f"{base}/v1/admin/producers/p/tokens", headers=admin).json()["token"]
        r = c.put(f"{base}/v1/admin/consumers/c", json={"keyspaces": ["app/"]}, headers=admin)
        assert r.status_code in (200, 201), r.text
        ctok = c.post(f"{base}/v1/admin/consumers/c/tokens", headers=admin).json()["token"]
        producer = {"Authorization": f"Bearer {ptok}"}
        r = c.put(f"{base}/v1/kv/app/x", content=b"secret", headers=producer)
        assert r.status_code in (200, 201), r.text

    # The consumer's certificate gets no frame, asking for the stream or a snapshot; nor
    # does one without a role; a replica's does.
    for mode in (frames.MODE_STREAM, frames.MODE_SNAPSHOT):
        assert _first_bytes(repl, pki["c1"], mode) == b""
        assert _first_bytes(repl, pki["legacy"], mode) == b""
    good = _first_bytes(repl, pki["r1"], frames.MODE_STREAM)
    assert good[:1] in (bytes([frames.WELCOME]), bytes([frames.REFUSE]))
    with https(pki["root"]) as c:
        text = c.get(f"{base}/metrics").text
    assert _refused(text, "wrong_role") == 2
    assert _refused(text, "no_role") == 2
    assert "role 'consumer'" in procs.logs()

    # A replica's certificate follows the root's; the consumer's reads with its token.
    h1 = free_port()
    r1 = procs.start_mercury(
        "replica", str(tmp_path / "r1"), "--listen", f"127.0.0.1:{h1}", "--source",
        f"127.0.0.1:{repl}", "--read-auth", *tls_flags(pki["r1"]), name="r1",
    )  # fmt: skip
    wait_https(f"https://127.0.0.1:{h1}/healthz", pki["r1"], r1)
    consumer = ssl.create_default_context(cafile=pki["c1"].ca)
    consumer.load_cert_chain(pki["c1"].cert, pki["c1"].key)
    with httpx.Client(verify=consumer, timeout=5) as c:
        bearer = {"Authorization": f"Bearer {ctok}"}
        wait_for(
            lambda: c.get(f"https://127.0.0.1:{h1}/v1/kv/app/x", headers=bearer).status_code == 200,
            60,
            "the replica caught up",
        )
        for url in (base, f"https://127.0.0.1:{h1}"):
            got = c.get(f"{url}/v1/kv/app/x", headers=bearer)
            assert got.status_code == 200 and got.content == b"secret"
            assert c.get(f"{url}/v1/kv/app/x").status_code == 401  # the token is the key
    procs.terminate(r1)
    procs.terminate(root)


def test_a_replica_follows_only_a_source_with_a_replication_role(
    tmp_path: Path, procs: Procs
) -> None:
    pki = _certs(tmp_path / "certs")
    # A source presenting a consumer's certificate (signed by the same CA, usable by a
    # server: `mercury certs` makes a consumer's for clients only, which TLS refuses).
    fake = RootNode(str(tmp_path / "fake"), tls=TlsContexts(pki["c1-server"]))
    legacy = RootNode(str(tmp_path / "legacy"), tls=TlsContexts(pki["legacy"]))
    try:
        fake.write(10)
        legacy.write(10)
        r1, _, _ = start_tls_replica(procs, tmp_path / "r1", fake.port, pki["r1"], "r1")
        r2, _, _ = start_tls_replica(procs, tmp_path / "r2", legacy.port, pki["r2"], "r2")

        def refusals(name: str, what: str) -> int:
            logs = [f.read_text(errors="replace") for f in procs.log_dir.glob(f"{name}-*.log")]
            return sum(text.count(what) for text in logs)

        # Until three attempts each are logged: the first, and retries after it.
        wait_for(lambda: refusals("r1", "role 'consumer'") >= 3, 60, "consumer source refused")
        wait_for(lambda: refusals("r2", "carries no role") >= 3, 60, "roleless source refused")
        for p, d in ((r1, "r1"), (r2, "r2")):
            assert p.poll() is None
            assert not (tmp_path / d / "data.mdb").exists()  # never got a snapshot
        procs.terminate(r1)
        procs.terminate(r2)

        # --tls-allow-roleless: the certificate without a role is followed, and logged.
        http = free_port()
        r3 = procs.start_mercury(
            "replica", str(tmp_path / "r3"), "--listen", f"127.0.0.1:{http}", "--source",
            f"127.0.0.1:{legacy.port}", *tls_flags(pki["r2"]), "--tls-allow-roleless",
            name="r3",
        )  # fmt: skip
        wait_https(f"https://127.0.0.1:{http}/healthz", pki["r2"], r3)
        seq = legacy.store.last_seq()
        with https(pki["r2"]) as c:
            wait_for(
                lambda: c.get(f"https://127.0.0.1:{http}/v1/status").json()["seq"] >= seq,
                60,
                "the replica caught up",
            )
        assert refusals("r3", "accepted because of --tls-allow-roleless") >= 1
        procs.terminate(r3)
        assert contents(str(tmp_path / "r3")) == items(legacy.store)
    finally:
        fake.close()
        legacy.close()


@pytest.mark.parametrize("bulk", [False, True])
def test_connect_refuses_a_source_without_a_replication_role(tmp_path: Path, bulk: bool) -> None:
    """Both kinds of connected link (a stream's, a bootstrap's) check the source."""
    pki = _certs(tmp_path / "certs")

    roles: list[str | None] = []

    async def go() -> None:
        async def handler(link: Link) -> None:
            await link.handshake(5)
            roles.append(getattr(link, "peer_role", None))

        for source, ok in (("c1-server", False), ("legacy", False), ("root", True)):
            listener = await TcpTransport(TlsContexts(pki[source])).listen("127.0.0.1", 0, handler)
            try:
                client = TcpTransport(TlsContexts(pki["r1"]))
                if ok:
                    link = await client.connect(*listener.address, timeout=5, bulk=bulk)
                    await link.close()
                else:
                    with pytest.raises(PeerRoleError):
                        await client.connect(*listener.address, timeout=5, bulk=bulk)
            finally:
                await listener.close()

    asyncio.run(go())
    # The accepted link names its peer's role (what the source hands the upstream channel).
    assert "replica" in roles


def test_only_a_root_certificate_reports_as_a_standby() -> None:
    """An HA leader counts APPLIED reports (which release its acknowledgements) only from
    a link whose certificate is a candidate's: a replica's certificate cannot make the
    leader acknowledge writes no standby holds."""
    gate = LeaderGate(1, 60.0)
    gate.applied(upstream.Origin(b"r" * 16, "127.0.0.1:1", "replica"), upstream.APPLIED,
                 upstream.encode_applied(10))  # fmt: skip
    assert gate.tracker.synced_seq(time.monotonic()) == 0
    assert gate.foreign_reports == 1
    gate.applied(upstream.Origin(b"s" * 16, "127.0.0.1:2", "root"), upstream.APPLIED,
                 upstream.encode_applied(7))  # fmt: skip
    assert gate.tracker.synced_seq(time.monotonic()) == 7


def test_a_node_refuses_to_start_with_a_certificate_it_cannot_replicate_with(
    tmp_path: Path,
) -> None:
    """A root (or replica) with a consumer's certificate, and an HA candidate (a standby
    replicates from the leader) with anything but a root certificate, stop at start with
    exit 2 naming the role, before binding anything."""
    pki = _certs(tmp_path / "certs")
    data = tmp_path / "data"
    assert run_mercury("init", str(data)).returncode == 0
    listen = ["--listen", f"127.0.0.1:{free_port()}"]
    res = run_mercury("root", str(data), *listen, *tls_flags(pki["c1"]))
    assert res.returncode == 2 and "carries role consumer" in res.stderr, res.stderr
    res = run_mercury("replica", str(tmp_path / "r"), *listen, "--source", "127.0.0.1:1",
                      *tls_flags(pki["legacy"]))  # fmt: skip
    assert res.returncode == 2 and "carries role none" in res.stderr, res.stderr
    candidate = ["--ha-etcd", "http://127.0.0.1:1", "--ha-group", "g", "--advertise-url",
                 "https://127.0.0.1:1"]  # fmt: skip
    res = run_mercury("root", str(data), *listen, *candidate, *tls_flags(pki["r1"]))
    assert res.returncode == 2 and "this node needs root" in res.stderr, res.stderr
