"""Docker images for the tests, built here because no registry can be reached.

Images built once per Docker engine and reused by every later run (the tag is the cache):

- `homegpu-test/busybox:latest`: `FROM scratch` plus Debian's static busybox. Builds in seconds;
  the runtime tests use it for containers that only need `sh`, `echo` and `sleep`.
- `homegpu-test/tensorflow:2.21`: Debian bookworm (debootstrap) with Python 3.11 and a venv holding
  tensorflow + tf-keras 2.21. Takes minutes (most of it pip); the orchestration tests train in it.
- `homegpu-test/pytorch:2.14`: the same Debian with torch 2.14.1 from PyPI (5.4 GB with its CUDA
  libraries); the PyTorch jobs' Docker tests train in it.
- `homegpu-test/jax:0.10`: the same Debian with jax 0.10.2 (CPU) from PyPI; the JAX jobs' Docker test trains in
  it. All three Python images start from `homegpu-test/debian:bookworm`, debootstrapped once.

A CI job can build them all ahead of the tests with `python tests/images.py`. Building is serialised
with a lock file, so two test runs on one machine do not build the same image twice at once.

The `tf_image`, `torch_image`, `jax_image` and `busybox_image` fixtures live here too (tests/conftest.py imports them); they fail,
never skip, when the image cannot be built.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import docker
import docker.errors
from docker.types import Mount
import pytest

BUSYBOX_TAG = "homegpu-test/busybox:latest"
BASE_TAG = "homegpu-test/debian:bookworm"  # debootstrapped Debian with Python 3.11: both Python images start here
TF_TAG = "homegpu-test/tensorflow:2.21"
TF_PACKAGES = ("tensorflow==2.21.0", "tf-keras==2.21.0")
TF_CHECK = "import tensorflow as tf, tf_keras; print('tensorflow', tf.__version__, 'tf_keras', tf_keras.__version__)"
TORCH_TAG = "homegpu-test/pytorch:2.14"
TORCH_PACKAGES = ("torch==2.14.1", "numpy")  # what the [pytorch] extra installs here: nodes' versions must agree
TORCH_CHECK = "import torch, torch.distributed; print('torch', torch.__version__)"
JAX_TAG = "homegpu-test/jax:0.10"
JAX_PACKAGES = ("jax==0.10.2", "numpy")  # what the [jax] extra installs here: nodes' versions must agree
JAX_CHECK = "import jax, jax.distributed; print('jax', jax.__version__)"

BUSYBOX_BINARY = "/bin/busybox"  # from Debian's busybox-static: statically linked, runs FROM scratch
BUSYBOX_DOCKERFILE = b"""\
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
CMD ["sh"]
"""

DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, which the tensorflow 2.21 wheels support
DEBIAN_MIRROR = os.environ.get("HOMEGPU_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEBOOTSTRAP_PACKAGES = "python3,python3-venv,ca-certificates"
CA_BUNDLE_IN_IMAGE = "/etc/ssl/certs/ca-certificates.crt"
IMAGE_PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOCK_PATH = "/var/lock/homegpu-test-images.lock"

# Per-package debootstrap chatter: hundreds of lines that say nothing about progress.
_DEBOOTSTRAP_NOISE = ("I: Retrieving ", "I: Validating ", "I: Extracting ", "I: Unpacking ", "I: Configuring ")
# Settings that make pip reach the index this machine uses (a proxy, a private mirror).
_FORWARDED_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT",
                  "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy")

Progress = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """A test image could not be built; the message carries the failing step's output."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- shared ----------------------------------------------------------------------------------------


def has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Hold an exclusive lock on this machine while building, so concurrent runs build once."""
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def context_tar(files: dict[str, bytes], modes: dict[str, int] | None = None) -> bytes:
    """An in-memory build context: file name -> content (mode 0644 unless `modes` says otherwise)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), (modes or {}).get(name, 0o644), int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# -- busybox ---------------------------------------------------------------------------------------


def ensure_busybox_image(client: docker.DockerClient, progress: Progress = _stderr) -> str:
    """The tag of a tiny busybox image, built from this machine's static busybox if missing."""
    if has_image(client, BUSYBOX_TAG):
        return BUSYBOX_TAG
    with build_lock():
        if not has_image(client, BUSYBOX_TAG):
            _build_busybox(client, progress)
    return BUSYBOX_TAG


def _build_busybox(client: docker.DockerClient, progress: Progress) -> None:
    binary = Path(BUSYBOX_BINARY).read_bytes() if os.path.exists(BUSYBOX_BINARY) else b""
    # A dynamic busybox (Debian's plain `busybox` package) names its loader near the start and
    # cannot run FROM scratch.
    if not binary or b"/ld-linux" in binary[:4096]:
        raise ImageBuildError(f"{BUSYBOX_BINARY} is missing or not static; run: apt-get install -y busybox-static")
    context = context_tar({"Dockerfile": BUSYBOX_DOCKERFILE, "busybox": binary}, modes={"busybox": 0o755})
    progress(f"building {BUSYBOX_TAG}")
    for chunk in client.api.build(fileobj=io.BytesIO(context), custom_context=True, tag=BUSYBOX_TAG,
                                  rm=True, forcerm=True, decode=True):
        if "error" in chunk:
            raise ImageBuildError(f"building {BUSYBOX_TAG} failed: {chunk['error'].strip()}")


# -- random data -----------------------------------------------------------------------------------


def random_tag(megabytes: int, layers: int) -> str:
    return f"homegpu-test/random:{megabytes}mb-{layers}l"


def ensure_random_image(client: docker.DockerClient, megabytes: int, layers: int = 4,
                        progress: Progress = _stderr) -> str:
    """The tag of an image of `layers` layers of random bytes, `megabytes` in all, on top of busybox.

    Random data does not compress, so no copy can go faster than the bytes themselves allow. Built
    once per engine (the tag is the cache), in seconds.
    """
    tag = random_tag(megabytes, layers)
    if has_image(client, tag):
        return tag
    base = ensure_busybox_image(client, progress)
    each = megabytes * 1_000_000 // layers
    files = {f"part{i}.bin": os.urandom(each) for i in range(layers)}
    steps = "".join(f"COPY part{i}.bin /data/part{i}.bin\n" for i in range(layers))
    files["Dockerfile"] = f"FROM {base}\n{steps}".encode()
    progress(f"building {tag}")
    with build_lock():
        for chunk in client.api.build(fileobj=io.BytesIO(context_tar(files)), custom_context=True, tag=tag,
                                      rm=True, forcerm=True, decode=True):
            if "error" in chunk:
                raise ImageBuildError(f"building {tag} failed: {chunk['error'].strip()}")
    return tag


# -- Python + TensorFlow, Python + PyTorch ---------------------------------------------------------


def ensure_tf_image(client: docker.DockerClient, progress: Progress = _stderr) -> str:
    """The tag of the Python + TensorFlow 2.21 test image, built if missing (a few minutes)."""
    return _ensure_python_image(client, TF_TAG, TF_PACKAGES, TF_CHECK, progress)


def ensure_torch_image(client: docker.DockerClient, progress: Progress = _stderr) -> str:
    """The tag of the Python + PyTorch test image, built if missing (a few minutes: torch from PyPI
    brings its CUDA libraries, 5.4 GB, FACTS.md)."""
    return _ensure_python_image(client, TORCH_TAG, TORCH_PACKAGES, TORCH_CHECK, progress)


def ensure_jax_image(client: docker.DockerClient, progress: Progress = _stderr) -> str:
    """The tag of the Python + JAX (CPU) test image, built if missing (under a minute: jax and jaxlib from PyPI)."""
    return _ensure_python_image(client, JAX_TAG, JAX_PACKAGES, JAX_CHECK, progress)


def _ensure_python_image(client: docker.DockerClient, tag: str, packages: tuple[str, ...], check: str,
                         progress: Progress) -> str:
    """`tag`: BASE_TAG with `packages` pip-installed in /opt/venv, built if missing and checked with `check`.

    No registry is reachable, so the base comes from debootstrap and `docker import`, and pip runs
    inside a container on the host network; the result is committed and checked by running `check`
    with `python` from PATH in it (what a worker does).
    """
    if has_image(client, tag):
        return tag
    with build_lock():
        if not has_image(client, tag):
            _build_python_image(client, tag, packages, check, progress)
    return tag


def _build_python_image(client: docker.DockerClient, tag: str, packages: tuple[str, ...], check: str,
                        progress: Progress) -> None:
    started = time.monotonic()
    _ensure_base_image(client, progress)
    try:
        pip_install(client, tag, packages, progress)
        output = client.containers.run(tag, ["python", "-c", check], remove=True,
                                       environment={"TF_CPP_MIN_LOG_LEVEL": "2"})
        progress(f"check: {output.decode(errors='replace').strip().splitlines()[-1]}")
    except BaseException:
        with contextlib.suppress(docker.errors.DockerException):
            client.images.remove(tag, force=True)
        raise
    size = client.images.get(tag).attrs["Size"]
    progress(f"built {tag} in {time.monotonic() - started:.0f} s, {size / 1e9:.2f} GB")


def _ensure_base_image(client: docker.DockerClient, progress: Progress) -> None:
    """BASE_TAG, debootstrapped and imported if missing (about a minute; the caller holds the build lock)."""
    if has_image(client, BASE_TAG):
        return
    with tempfile.TemporaryDirectory(prefix="homegpu-rootfs-", dir="/var/tmp") as rootfs:
        debootstrap(rootfs, progress)
        import_rootfs(client, rootfs, BASE_TAG, progress)


def debootstrap(rootfs: str, progress: Progress) -> None:
    """A minimal Debian with Python 3 and CA certificates in `rootfs` (about a minute)."""
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is missing; run: apt-get install -y debootstrap")
    argv = ["debootstrap", "--variant=minbase", f"--include={DEBOOTSTRAP_PACKAGES}", DEBIAN_SUITE, rootfs,
            DEBIAN_MIRROR]
    progress(f"debootstrap {DEBIAN_SUITE} into {rootfs}")
    _run_streaming(argv, "debootstrap", progress, skip=_DEBOOTSTRAP_NOISE)


def _run_streaming(argv: list[str], name: str, progress: Progress, skip: tuple[str, ...] = ()) -> None:
    """Run argv, passing its output lines to `progress`; ImageBuildError with the tail if it fails."""
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-20:]
            if not line.startswith(skip):
                progress(f"{name}: {line}")
    if proc.returncode != 0:
        raise ImageBuildError(f"{name} failed ({proc.returncode}):\n" + "\n".join(tail))


def import_rootfs(client: docker.DockerClient, rootfs: str, tag: str, progress: Progress) -> None:
    """`tar -C rootfs -c . | docker import - tag`, streamed through the API (no tar file on disk)."""
    progress(f"importing the root file system as {tag}")
    with subprocess.Popen(["tar", "-C", rootfs, "--numeric-owner", "-c", "."], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as tar:
        chunks = iter(lambda: tar.stdout.read(1 << 20), b"")
        repository, _, version = tag.rpartition(":")
        client.api.import_image(src=chunks, repository=repository, tag=version, stream_src=True)
        errors = tar.stderr.read().decode(errors="replace")
    if tar.returncode != 0:
        raise ImageBuildError(f"tar of {rootfs} failed: {errors.strip()}")


def pip_install(client: docker.DockerClient, tag: str, packages: tuple[str, ...], progress: Progress) -> None:
    """pip install `packages` into /opt/venv in a container of BASE_TAG, then commit it as `tag`.

    pip runs through `exec` with its settings as exec-only environment: a container's own
    environment would be committed into the image (proxy settings included).
    """
    script = ("set -e; ln -sf /usr/bin/python3 /usr/local/bin/python; python3 -m venv /opt/venv; "
              "/opt/venv/bin/pip install --no-cache-dir --progress-bar off " + " ".join(packages))
    mounts, environment = pip_settings()
    container = client.containers.create(BASE_TAG, ["sleep", "infinity"], network_mode="host", mounts=mounts)
    try:
        container.start()
        status, tail = _exec_streaming(client, container.id, ["sh", "-c", script], environment, progress)
        if status != 0:
            raise ImageBuildError(f"pip install in {BASE_TAG} failed ({status}):\n" + "\n".join(tail))
        repository, _, version = tag.rpartition(":")
        container.commit(repository=repository, tag=version,
                         changes=[f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", 'CMD ["python"]'])
    finally:
        container.remove(force=True)


def _exec_streaming(client: docker.DockerClient, container: str, argv: list[str], environment: dict,
                    progress: Progress) -> tuple[int, list[str]]:
    """Run argv in the container, passing its output lines to `progress`; (exit status, last lines)."""
    exec_id = client.api.exec_create(container, argv, environment=environment)["Id"]
    pending, tail = b"", []
    for chunk in client.api.exec_start(exec_id, stream=True):
        *lines, pending = (pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            tail = (tail + [line])[-20:]
            progress(f"pip: {line}")
    return client.api.exec_inspect(exec_id)["ExitCode"], tail


def pip_settings() -> tuple[list[Mount], dict]:
    """Mounts and environment that let pip in the container reach the index pip reaches here.

    This machine may intercept TLS with its own CA, so its CA bundle goes in and PIP_CERT points at
    it. Index and proxy variables are forwarded; file:// indexes and find-links in the host's pip
    config are host paths the container cannot see, and plain PyPI serves everything needed.
    A Mount, not `volumes=`: docker-py also lists volume targets in the container config, `docker
    commit` keeps them as VOLUMEs, and the image then cannot start (a volume over a file).
    """
    environment = {key: os.environ[key] for key in _FORWARDED_ENV if os.environ.get(key)}
    bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or CA_BUNDLE_IN_IMAGE
    mounts = []
    if os.path.isfile(bundle):
        mounts.append(Mount(CA_BUNDLE_IN_IMAGE, os.path.realpath(bundle), type="bind", read_only=True))
        environment["PIP_CERT"] = CA_BUNDLE_IN_IMAGE
    return mounts, environment


# -- fixtures --------------------------------------------------------------------------------------


def _live_progress(request: pytest.FixtureRequest) -> Progress:
    """Progress lines shown as they come even under output capture: a build takes minutes."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def show(line: str) -> None:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            _stderr(f"[test image] {line}")

    return show


def _ensure(request: pytest.FixtureRequest, socket_path: str, ensure: Callable[..., str]) -> str:
    client = docker.DockerClient(base_url=f"unix://{socket_path}")
    try:
        return ensure(client, _live_progress(request))
    except (ImageBuildError, docker.errors.DockerException) as exc:
        problem = str(exc)
    finally:
        client.close()
    pytest.fail(f"test image not built: {problem}", pytrace=False)


@pytest.fixture(scope="session")
def tf_image(request: pytest.FixtureRequest, docker_engine) -> str:
    """Tag of the Python + TensorFlow 2.21 image in the docker_engine (built on first use)."""
    return _ensure(request, docker_engine.socket_path, ensure_tf_image)


@pytest.fixture(scope="session")
def torch_image(request: pytest.FixtureRequest, docker_engine) -> str:
    """Tag of the Python + PyTorch image in the docker_engine (built on first use)."""
    return _ensure(request, docker_engine.socket_path, ensure_torch_image)


@pytest.fixture(scope="session")
def jax_image(request: pytest.FixtureRequest, docker_engine) -> str:
    """Tag of the Python + JAX image in the docker_engine (built on first use)."""
    return _ensure(request, docker_engine.socket_path, ensure_jax_image)


@pytest.fixture(scope="session")
def busybox_image(request: pytest.FixtureRequest, docker_engine) -> str:
    """Tag of the busybox image in the docker_engine (built on first use, in seconds)."""
    return _ensure(request, docker_engine.socket_path, ensure_busybox_image)


def main() -> int:
    """`python tests/images.py`: build the images ahead of the tests (a CI step)."""
    from simdocker import ensure_docker  # this file's directory is on sys.path when run as a script

    # tests/run.sh stops a build it started beside the fast tier when that fails: end as Ctrl-C would, so the
    # build's children are killed and a Docker engine started here is stopped again
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = ensure_docker()
    client = docker.DockerClient(base_url=f"unix://{engine.socket_path}")
    try:
        for ensure in (ensure_busybox_image, ensure_tf_image, ensure_torch_image, ensure_jax_image):
            print(ensure(client))
    finally:
        client.close()
        engine.stop()  # only if ensure_docker started it; the images stay in the engine's data root
    return 0


if __name__ == "__main__":
    sys.exit(main())
