"""systemd/: the classic .service verifies cleanly, the Quadlet .container uses only keys its
generator knows, sysusers/tmpfiles create the user, group and directories the image expects.

Quadlet itself ships with Podman >= 4.4 and Debian bookworm has 4.3, so the .container file is
checked against the key list below (the operator guide shows `quadlet -dryrun` on the box).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging_support import need_tool

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"

# The [Container] keys of Podman 5.x's Quadlet (pkg/systemd/quadlet/quadlet.go, groupsInfo
# ContainerGroup.SupportedKeys, v5 branch); any other key makes the generator refuse the file.
QUADLET_CONTAINER_KEYS = frozenset(
    """
AddCapability AddDevice AddHost Annotation AutoUpdate CgroupsMode ContainerName ContainersConfModule
DNS DNSOption DNSSearch DropCapability Environment EnvironmentFile EnvironmentHost Entrypoint Exec
ExposeHostPort GIDMap GlobalArgs Group GroupAdd HealthCmd HealthInterval HealthOnFailure
HealthLogDestination HealthMaxLogCount HealthMaxLogSize HealthRetries HealthStartPeriod
HealthStartupCmd HealthStartupInterval HealthStartupRetries HealthStartupSuccess HealthStartupTimeout
HealthTimeout HostName IP6 IP Image Label LogDriver LogOpt Mask Memory Mount Network NetworkAlias
NoNewPrivileges Notify PidsLimit Pod PodmanArgs PublishPort Pull ReadOnly ReadOnlyTmpfs ReloadCmd
ReloadSignal RemapGid RemapUid RemapUidSize RemapUsers Retry RetryDelay Rootfs RunInit SeccompProfile
Secret SecurityLabelDisable SecurityLabelFileType SecurityLabelLevel SecurityLabelNested
SecurityLabelType ServiceName ShmSize StopSignal StartWithPod StopTimeout SubGIDMap SubUIDMap Sysctl
Timezone Tmpfs UIDMap Ulimit Unmask User UserNS VolatileTmp Volume WorkingDir
""".split()
)
QUADLET_SECTIONS = {"Unit", "Container", "Service", "Install", "Quadlet"}


def unit_entries(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, continuation lines joined, in file order."""
    entries, section, pending = [], None, ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(path: Path, section: str, key: str) -> list[str]:
    return [value for sec, k, value in unit_entries(path) if (sec, k) == (section, key)]


def test_classic_service_verifies_without_a_word():
    analyze = need_tool("systemd-analyze", "systemd")

    result = subprocess.run([analyze, "verify", str(SYSTEMD_DIR / "appliance.service")], capture_output=True, text=True)

    # An unknown key or a bad value is only a warning on stderr: any output fails.
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


def test_quadlet_file_uses_only_keys_the_generator_knows():
    entries = unit_entries(SYSTEMD_DIR / "appliance.container")

    sections = {section for section, _, _ in entries}
    unknown = [key for section, key, _ in entries if section == "Container" and key not in QUADLET_CONTAINER_KEYS]

    assert sections <= QUADLET_SECTIONS
    assert unknown == []


def test_quadlet_unit_and_service_sections_verify(tmp_path: Path):
    """Quadlet copies [Unit], [Service] and [Install] verbatim into the generated unit and adds
    its own ExecStart; verify those sections as systemd will see them."""
    analyze = need_tool("systemd-analyze", "systemd")
    podman = need_tool("podman", "podman")
    lines = []
    for section in ("Unit", "Service", "Install"):
        lines.append(f"[{section}]")
        lines += [
            f"{key}={value}" for sec, key, value in unit_entries(SYSTEMD_DIR / "appliance.container") if sec == section
        ]
        if section == "Service":
            lines.append(f"ExecStart={podman} run --rm --name appliance localhost/appliance:0.1.0")
    generated = tmp_path / "appliance.service"
    generated.write_text("\n".join(lines) + "\n")

    # --man=no: its Documentation= page, podman-systemd.unit(5), comes with Podman >= 4.4, not this host's.
    result = subprocess.run([analyze, "verify", "--man=no", str(generated)], capture_output=True, text=True)

    assert (result.returncode, result.stderr) == (0, "")


def test_quadlet_container_is_hardened_and_never_pulls():
    container = SYSTEMD_DIR / "appliance.container"
    get = {key: values(container, "Container", key) for _, key, _ in unit_entries(container)}

    assert get["Pull"] == ["never"]
    assert get["Notify"] == ["true"]
    assert get["AddDevice"] == ["nvidia.com/gpu=all"]
    assert get["ReadOnly"] == ["true"] and get["NoNewPrivileges"] == ["true"]
    assert get["DropCapability"] == ["all"]
    assert get["User"] == ["appliance"]
    assert any(
        volume.split(":")[1] == "/models" and "ro" in volume.split(":")[2].split(",") for volume in get["Volume"]
    )
    assert values(container, "Service", "Restart") == ["on-failure"]
    assert int(values(container, "Unit", "StartLimitBurst")[0]) > 0
    assert int(values(container, "Service", "TimeoutStartSec")[0]) >= 600


def test_docker_and_podman_units_run_the_same_container():
    container = SYSTEMD_DIR / "appliance.container"
    exec_start = values(SYSTEMD_DIR / "appliance.service", "Service", "ExecStart")[0].split()

    def after(flag: str) -> list[str]:
        return [exec_start[i + 1] for i, word in enumerate(exec_start) if word == flag]

    podman_volumes = {volume.split(":")[0]: volume.split(":")[1] for volume in values(container, "Container", "Volume")}
    docker_volumes = {volume.split(":")[0]: volume.split(":")[1] for volume in after("--volume")}
    assert docker_volumes == podman_volumes
    assert after("--publish") == values(container, "Container", "PublishPort")
    assert exec_start[-1] == values(container, "Container", "Image")[0]
    assert "--gpus" in exec_start and "--read-only" in exec_start
    assert after("--cap-drop") == ["ALL"] and after("--user") == ["appliance:appliance"]


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """An empty host root with the appliance's sysusers.d entry applied by the real systemd-sysusers."""
    sysusers = need_tool("systemd-sysusers", "systemd")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        (root / "etc" / name).write_text(
            "root:x:0:0:root:/root:/bin/sh\n" if name == "passwd" else "root:x:0:\n" if name == "group" else ""
        )
    subprocess.run(
        [sysusers, f"--root={root}", str(SYSTEMD_DIR / "appliance.sysusers.conf")],
        check=True,
        capture_output=True,
        text=True,
    )
    return root


def test_sysusers_gives_the_host_the_image_ids(host_root: Path):
    passwd = [line.split(":") for line in (host_root / "etc" / "passwd").read_text().splitlines()]
    group = [line.split(":") for line in (host_root / "etc" / "group").read_text().splitlines()]

    # The image's user (Dockerfile APPLIANCE_UID/GID, checked in tests/images) is 10001:10001.
    assert ["appliance", "x", "10001", "10001"] in [entry[:4] for entry in passwd]
    assert ["appliance", "x", "10001"] in [entry[:3] for entry in group]


def test_tmpfiles_makes_the_socket_and_state_directories(host_root: Path):
    tmpfiles = need_tool("systemd-tmpfiles", "systemd")

    result = subprocess.run(
        [tmpfiles, f"--root={host_root}", "--create", str(SYSTEMD_DIR / "appliance.tmpfiles.conf")],
        capture_output=True,
        text=True,
    )

    assert result.returncode == 0, result.stderr
    made = {
        folder: (host_root / folder.lstrip("/")).stat()
        for folder in ("/run/appliance", "/var/lib/appliance", "/var/lib/appliance-models")
    }
    assert {folder: (st.st_mode & 0o777, st.st_gid) for folder, st in made.items()} == {
        "/run/appliance": (0o750, 10001),
        "/var/lib/appliance": (0o750, 10001),
        "/var/lib/appliance-models": (0o750, 10001),
    }
    assert made["/run/appliance"].st_uid == 10001 and made["/var/lib/appliance-models"].st_uid == 0


def _seconds_after(words: list[str], flag: str) -> float:
    return float(words[words.index(flag) + 1])


def test_a_stop_lets_the_running_step_checkpoint_before_anything_is_killed():
    """systemd's stop timeout > the container's stop timeout > the daemon's own checkpoint budget, with room.

    Quadlet stops with `podman stop`, whose default 10 s would SIGKILL the daemon mid-checkpoint; the Docker
    unit stops with `docker stop --time`. The daemon's budget is the image CMD's --stop-timeout.
    """
    container, service = SYSTEMD_DIR / "appliance.container", SYSTEMD_DIR / "appliance.service"
    dockerfile = (SYSTEMD_DIR.parent / "Dockerfile").read_text()
    cmd = json.loads(next(line for line in dockerfile.splitlines() if line.startswith("CMD ["))[len("CMD ") :])
    daemon_budget = _seconds_after(cmd, "--stop-timeout")
    margin = 10.0

    podman_stop = float(values(container, "Container", "StopTimeout")[0])
    docker_stop = _seconds_after(values(service, "Service", "ExecStop")[0].split(), "--time")
    for unit, container_stop in ((container, podman_stop), (service, docker_stop)):
        systemd_stop = float(values(unit, "Service", "TimeoutStopSec")[0])
        assert systemd_stop >= container_stop + margin, unit.name
        assert container_stop >= daemon_budget + margin, unit.name


def test_both_units_run_an_init_and_bound_the_process_count():
    container = SYSTEMD_DIR / "appliance.container"
    exec_start = values(SYSTEMD_DIR / "appliance.service", "Service", "ExecStart")[0].split()

    assert values(container, "Container", "RunInit") == ["true"] and "--init" in exec_start
    pids_limit = int(values(container, "Container", "PidsLimit")[0])
    assert 0 < pids_limit == int(exec_start[exec_start.index("--pids-limit") + 1])


def exposure(root: Path) -> float:
    """systemd-analyze's overall exposure of appliance.service under `root` (its unit and drop-ins), offline:
    no systemd needs to run here."""
    analyze = need_tool("systemd-analyze", "systemd")
    result = subprocess.run(
        [analyze, "security", "--offline=true", f"--root={root}", "appliance.service"], capture_output=True, text=True
    )
    found = re.search(r"Overall exposure level for appliance\.service: ([0-9.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    return float(found.group(1))


def install_unit(root: Path, hardening: bool) -> Path:
    units = root / "etc" / "systemd" / "system"
    (units / "appliance.service.d").mkdir(parents=True)
    shutil.copy(SYSTEMD_DIR / "appliance.service", units)
    if hardening:
        shutil.copy(SYSTEMD_DIR / "appliance.service.d" / "hardening.conf", units / "appliance.service.d")
    return units


def test_the_docker_unit_with_its_hardening_drop_in_scores_at_most_3(tmp_path: Path):
    hardened = exposure(install_unit(tmp_path / "hardened", hardening=True).parents[2])
    bare = exposure(install_unit(tmp_path / "bare", hardening=False).parents[2])

    assert hardened <= 3.0, f"systemd-analyze security: {hardened}"
    assert bare > 9.0  # the same unit without the drop-in: what the drop-in is for


def test_the_hardening_drop_in_verifies_beside_the_unit(tmp_path: Path):
    analyze = need_tool("systemd-analyze", "systemd")
    units = install_unit(tmp_path, hardening=True)

    result = subprocess.run([analyze, "verify", str(units / "appliance.service")], capture_output=True, text=True)

    assert (result.returncode, result.stderr) == (0, "")
    text = (SYSTEMD_DIR / "appliance.service.d" / "hardening.conf").read_text()
    for setting in ("ProtectSystem=strict", "RestrictAddressFamilies=AF_UNIX", "CapabilityBoundingSet=\n"):
        assert setting in text
    assert "SystemCallFilter=@system-service" in text


@pytest.mark.parametrize("runtime", ["podman", "podman-classic", "docker"])
@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_every_unit_the_installer_writes_verifies_and_asks_for_a_gpu_only_on_gpu_boxes(
    runtime: str, device: str, tmp_path: Path
):
    from appliance.bundle.box import Release, render_units

    bundle = tmp_path / "bundle"
    shutil.copytree(SYSTEMD_DIR, bundle / "systemd")
    release = Release("0.2.0", 2, (), runtime, device)

    units = render_units(bundle, release)
    text = "\n".join(units.values())
    for path, unit in units.items():
        (tmp_path / path.name).write_text(unit)
    main = tmp_path / ("appliance.container" if runtime == "podman" else "appliance.service")

    asks_gpu = "nvidia.com/gpu=all" in text or "--gpus all" in text
    assert asks_gpu == (device == "gpu")
    assert "localhost/appliance:0.2.0" in text and "localhost/appliance:0.1.0" not in text
    if runtime != "podman":
        commands = [value.split()[0] for sec, key, value in unit_entries(main) if key.startswith("Exec")]
        assert {command.lstrip("-") for command in commands} == {"docker" if runtime == "docker" else "podman"}
        assert ("docker.service" in text) == (runtime == "docker")
    if runtime == "podman":
        unknown = [
            key for sec, key, _ in unit_entries(main) if sec == "Container" and key not in QUADLET_CONTAINER_KEYS
        ]
        assert unknown == []
    else:
        analyze = need_tool("systemd-analyze", "systemd")
        result = subprocess.run([analyze, "verify", "--man=no", str(main)], capture_output=True, text=True)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
