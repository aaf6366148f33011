"""NetworkPolicy and the task keys it comes from (pure): modes, Harbor's allowed_hosts
entries, phase overrides, the address checks that keep the worker's services unreachable."""

import ipaddress
import shutil

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.network import (
    NetworkPolicy,
    NetworkPolicyError,
    PhaseNetwork,
    network_policy,
    resolve_network,
)
from trialflow.tasks import load_task

A = ipaddress.ip_address


def test_no_network_and_public():
    assert not NetworkPolicy().allows("pypi.org", [A("151.101.0.223")])
    public = NetworkPolicy("public")
    assert public.allows("pypi.org", [A("151.101.0.223")])
    for inner in ("127.0.0.1", "10.0.0.5", "192.168.1.1", "169.254.169.254", "::1", "172.17.0.1"):
        assert not public.allows("evil.example", [A(inner)]), inner
    # Every address must pass: a name resolving to a public and a loopback address is refused.
    assert not public.allows("mixed.example", [A("151.101.0.223"), A("127.0.0.1")])


def test_allowlist_entries():
    policy = NetworkPolicy("allowlist", ("PyPI.org.", "*.pythonhosted.org", "127.0.0.2", "198.51.100.0/24"))
    assert policy.allowed_hosts == ("pypi.org", "*.pythonhosted.org", "127.0.0.2", "198.51.100.0/24")
    assert policy.allows("pypi.org", [A("151.101.0.223")])
    assert policy.allows("files.pythonhosted.org", [A("151.101.0.1")])
    assert not policy.allows("pythonhosted.org.evil.com", [A("151.101.0.1")])
    assert policy.allows("127.0.0.2", [A("127.0.0.2")])
    assert not policy.allows("127.0.0.1", [A("127.0.0.1")])
    assert policy.allows("198.51.100.7", [A("198.51.100.7")])
    assert not policy.allows("other.org", [A("151.101.0.223")])
    for bad in ("https://pypi.org", "pypi.org:443", "*pypi.org", "a.*.org", "10.0.0.0/33", ""):
        with pytest.raises(NetworkPolicyError):
            NetworkPolicy("allowlist", (bad,))
    with pytest.raises(NetworkPolicyError, match="only valid"):
        NetworkPolicy("public", ("pypi.org",))
    with pytest.raises(NetworkPolicyError):
        NetworkPolicy("internet")  # type: ignore[arg-type]


def test_a_listed_name_admits_only_global_addresses_not_the_workers_own():
    policy = NetworkPolicy("allowlist", ("vm", "*.example.org", "127.0.0.2"))
    for inner in ("127.0.0.1", "10.0.0.5", "169.254.169.254", "::1", "::ffff:127.0.0.1", "64:ff9b::a00:1"):
        assert not policy.allows("vm", [A(inner)]), inner
        assert not policy.allows("db.example.org", [A(inner)]), inner
    assert policy.allows("vm", [A("151.101.0.223")])
    # every address: one listed address does not carry an unlisted private one
    assert not policy.allows("vm", [A("151.101.0.223"), A("10.0.0.5")])
    assert policy.allows("127.0.0.2", [A("127.0.0.2")])  # listed by the task itself
    worker = A("151.101.0.9")
    assert not policy.allows("vm", [worker], own=lambda a: a == worker)
    assert not NetworkPolicy("public").allows("x.org", [worker], own=lambda a: a == worker)
    assert not NetworkPolicy("public").allows("x.org", [A("::ffff:10.0.0.1")])


def _with_sections(tmp_path, environment: str = "", agent: str = "", verifier: str = ""):
    root = tmp_path / "t"
    shutil.copytree(EXAMPLES / "create-file", root, dirs_exist_ok=True)
    import tomllib

    data = tomllib.loads((root / "task.toml").read_text())
    lines = []
    for name, extra in (("environment", environment), ("agent", agent), ("verifier", verifier)):
        section = data.get(name, {})
        body = "\n".join(
            f"{k} = {v!r}".replace("'", '"') for k, v in section.items() if not isinstance(v, dict)
        )
        lines.append(f"[{name}]\n{body}\n{extra}\n")
    rest = {k: v for k, v in data.items() if k not in ("environment", "agent", "verifier")}
    head = "\n".join(f'{k} = "{v}"' for k, v in rest.items() if isinstance(v, str))
    (root / "task.toml").write_text(head + "\n" + "\n".join(lines))
    return load_task(root)


def test_task_keys_map_to_policies(tmp_path):
    plain = load_task(EXAMPLES / "create-file")
    assert network_policy(plain, "agent") == NetworkPolicy("no-network")
    t = _with_sections(tmp_path / "a", environment='network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]')
    assert network_policy(t, "agent") == NetworkPolicy("allowlist", ("pypi.org",))
    assert network_policy(t, "verifier") == NetworkPolicy("allowlist", ("pypi.org",))
    t = _with_sections(
        tmp_path / "b", environment="allow_internet = true", verifier='network_mode = "no-network"'
    )
    assert network_policy(t, "agent").mode == "public"
    assert network_policy(t, "verifier").mode == "no-network"
    t = _with_sections(tmp_path / "c", environment="allow_internet = false")
    assert network_policy(t, "agent").mode == "no-network"
    t = _with_sections(tmp_path / "d", agent='network_mode = "allowlist"\nallowed_hosts = ["127.0.0.2"]')
    assert network_policy(t, "agent") == NetworkPolicy("allowlist", ("127.0.0.2",))
    # The verifier's baseline is the environment's (unstated: Harbor's public), not the agent's.
    assert network_policy(t, "verifier") == NetworkPolicy("public")


def test_where_the_task_states_nothing_the_run_decides(tmp_path):
    """Agent no-network (training), verifier public (Harbor's default); the run's defaults
    and forced modes, and each answer's origin."""
    plain = load_task(EXAMPLES / "create-file")
    assert resolve_network(plain, "agent") == (NetworkPolicy("no-network"), "default")
    assert resolve_network(plain, "verifier") == (NetworkPolicy("public"), "default")
    assert resolve_network(plain, "agent", PhaseNetwork("public")) == (NetworkPolicy("public"), "default")
    assert resolve_network(plain, "verifier", PhaseNetwork("no-network"))[0].mode == "no-network"
    stated = _with_sections(
        tmp_path / "s", environment='network_mode = "allowlist"\nallowed_hosts = ["a.org"]'
    )
    assert resolve_network(stated, "verifier", PhaseNetwork("no-network")) == (
        NetworkPolicy("allowlist", ("a.org",)),
        "task",
    )
    # Forced: whatever the task states, also over an explicit public.
    public = _with_sections(tmp_path / "p", agent='network_mode = "public"')
    assert resolve_network(public, "agent") == (NetworkPolicy("public"), "task")
    forced = PhaseNetwork("public", forced="no-network")
    assert resolve_network(public, "agent", forced) == (NetworkPolicy("no-network"), "run")
    assert resolve_network(stated, "verifier", forced) == (NetworkPolicy("no-network"), "run")


def test_a_runs_extra_hosts_widen_the_phases_allowlist_as_harbors(tmp_path):
    """Harbor's merge_extra_allowlists: no-network becomes an allowlist of the run's hosts, an
    allowlist gets them appended (once), public stays public."""
    plain = load_task(EXAMPLES / "create-file")
    extra = PhaseNetwork("no-network", extra_hosts=("127.0.0.2", "pypi.org"))
    assert resolve_network(plain, "agent", extra) == (
        NetworkPolicy("allowlist", ("127.0.0.2", "pypi.org")),
        "run",
    )
    assert resolve_network(plain, "verifier", PhaseNetwork("public", extra_hosts=("x.org",))) == (
        NetworkPolicy("public"),
        "default",
    )
    listed = _with_sections(
        tmp_path / "l", environment='network_mode = "allowlist"\nallowed_hosts = ["pypi.org"]'
    )
    assert resolve_network(listed, "agent", extra)[0] == NetworkPolicy("allowlist", ("pypi.org", "127.0.0.2"))
    forced = PhaseNetwork("public", forced="no-network", extra_hosts=("127.0.0.2",))
    assert resolve_network(listed, "verifier", forced) == (NetworkPolicy("allowlist", ("127.0.0.2",)), "run")
