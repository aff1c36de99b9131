"""Settings precedence: flag > environment > file > default (zres.config.load)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from zres.config import DEFAULT_ADDRESS, ConfigError, load, quotas
from zres.core.resources import UNIT


@pytest.fixture(autouse=True)
def _empty_cwd(tmp_path, monkeypatch):
    """Run each test in an empty directory, so no stray ./zres.toml is picked up."""
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# -- defaults and precedence -------------------------------------------------------------


def test_defaults_with_nothing_set():
    broker = load("broker", environ={})
    assert broker["listen"] == DEFAULT_ADDRESS
    assert broker["heartbeat_interval"] == 0.5
    agent = load("agent", environ={})
    assert agent["resources"] == {}
    assert agent["nworkers"] == 1
    assert agent["broker"] is None
    assert load("client", environ={})["broker"] is None


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    conf = write(tmp_path / "z.toml", "[agent]\nnthreads = 2\nnworkers = 3\nname = 'file'\n")
    env = {"ZRES_AGENT__NTHREADS": "4", "ZRES_AGENT__NWORKERS": "5"}
    got = load("agent", {"nthreads": 8}, path=conf, environ=env)
    assert got["nthreads"] == 8           # flag beats environment and file
    assert got["nworkers"] == 5           # environment beats file
    assert got["name"] == "file"          # file beats default
    assert got["heartbeat_timeout"] == 3.0  # default
    assert load("agent", path=conf, environ={})["nthreads"] == 2
    assert load("agent", path=conf, environ=env)["nthreads"] == 4


def test_flags_given_as_none_do_not_override(tmp_path):
    conf = write(tmp_path / "z.toml", "[broker]\nlisten = 'tcp://10.0.0.1:9000'\n")
    got = load("broker", {"listen": None}, path=conf, environ={})
    assert got["listen"] == "tcp://10.0.0.1:9000"


def test_env_values_are_converted_to_their_types():
    got = load("broker", environ={"ZRES_BROKER__HEARTBEAT_INTERVAL": "0.25",
                                  "ZRES_BROKER__STARVATION_AFTER": "10"})
    assert got["heartbeat_interval"] == 0.25
    assert got["starvation_after"] == 10.0 and isinstance(got["starvation_after"], float)
    got = load("agent", environ={"ZRES_AGENT__NTHREADS": "4"})
    assert got["nthreads"] == 4 and isinstance(got["nthreads"], int)


def test_forward_output_is_on_unless_turned_off(tmp_path):
    assert load("client", environ={})["forward_output"] is True
    for off in ("0", "false", "No"):
        assert load("client", environ={"ZRES_CLIENT__FORWARD_OUTPUT": off})[
            "forward_output"] is False
    conf = write(tmp_path / "z.toml", "[client]\nforward_output = false\n")
    assert load("client", path=conf, environ={})["forward_output"] is False
    assert load("client", {"forward_output": True}, path=conf, environ={})["forward_output"]
    with pytest.raises(ConfigError, match="forward_output must be true or false, got 'loud'"):
        load("client", environ={"ZRES_CLIENT__FORWARD_OUTPUT": "loud"})


def test_env_for_other_sections_is_ignored():
    got = load("agent", environ={"ZRES_BROKER__LISTEN": "tcp://1.2.3.4:1",
                                 "ZRES_CLIENT__BROKER_TIMEOUT": "3"})
    assert "listen" not in got
    assert got["nworkers"] == 1


def test_zres_broker_is_the_broker_address_for_agents_and_clients():
    env = {"ZRES_BROKER": "tcp://head:7070"}
    assert load("agent", environ=env)["broker"] == "tcp://head:7070"
    assert load("client", environ=env)["broker"] == "tcp://head:7070"
    assert load("agent", {"broker": "tcp://other:1"}, environ=env)["broker"] == "tcp://other:1"


# -- the config file ---------------------------------------------------------------------


def test_file_via_path(tmp_path):
    conf = write(tmp_path / "z.toml", "[broker]\nlisten = 'tcp://127.0.0.1:9999'\n"
                                      "heartbeat_timeout = 7\n")
    got = load("broker", path=conf, environ={})
    assert got["listen"] == "tcp://127.0.0.1:9999"
    assert got["heartbeat_timeout"] == 7.0


def test_file_via_zres_config_env(tmp_path):
    conf = write(tmp_path / "z.toml", "[agent]\nresources = 'GPU=2 foo=1'\n")
    got = load("agent", environ={"ZRES_CONFIG": conf})
    assert got["resources"] == {"GPU": 2 * UNIT, "foo": UNIT}


def test_path_beats_zres_config(tmp_path):
    one = write(tmp_path / "one.toml", "[agent]\nname = 'one'\n")
    two = write(tmp_path / "two.toml", "[agent]\nname = 'two'\n")
    assert load("agent", path=one, environ={"ZRES_CONFIG": two})["name"] == "one"


def test_zres_toml_in_the_working_directory_is_read(_empty_cwd):
    (_empty_cwd / "zres.toml").write_text("[agent]\nname = 'here'\n")
    assert load("agent", environ={})["name"] == "here"


def test_file_resources_as_a_table_keep_case(tmp_path):
    conf = write(tmp_path / "z.toml",
                 "[agent.resources]\nGPU = 2\ngpu0 = 1\nMEMORY = '64GiB'\n")
    got = load("agent", path=conf, environ={})
    assert got["resources"] == {"GPU": 2 * UNIT, "gpu0": UNIT, "MEMORY": 64 * 2**30 * UNIT}


def test_file_without_the_section_gives_defaults(tmp_path):
    conf = write(tmp_path / "z.toml", "[broker]\nlisten = 'tcp://127.0.0.1:1'\n")
    assert load("agent", path=conf, environ={})["nworkers"] == 1


def test_missing_file_is_an_error_naming_it(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="nope.toml"):
        load("agent", path=missing, environ={})
    with pytest.raises(ConfigError, match="nope.toml"):
        load("agent", environ={"ZRES_CONFIG": missing})


def test_invalid_toml_is_an_error_naming_the_file(tmp_path):
    conf = write(tmp_path / "broken.toml", "[agent\nname = \n")
    with pytest.raises(ConfigError, match="broken.toml.*not valid TOML"):
        load("agent", path=conf, environ={})


# -- resources from the environment ------------------------------------------------------


def test_env_whole_spec():
    got = load("agent", environ={"ZRES_AGENT__RESOURCES": "GPU=2 MEMORY=100e9"})
    assert got["resources"] == {"GPU": 2 * UNIT, "MEMORY": 100 * 10**9 * UNIT}


def test_env_per_name_keeps_case():
    got = load("agent", environ={"ZRES_AGENT__RESOURCES__gpu0": "1",
                                 "ZRES_AGENT__RESOURCES__Licence": "2"})
    assert got["resources"] == {"gpu0": UNIT, "Licence": 2 * UNIT}


def test_env_per_name_overrides_the_whole_spec():
    env = {"ZRES_AGENT__RESOURCES": "GPU=2 MEMORY=100e9",
           "ZRES_AGENT__RESOURCES__GPU": "1",
           "ZRES_AGENT__RESOURCES__gpu0": "1"}
    got = load("agent", environ=env)
    assert got["resources"] == {"GPU": UNIT, "MEMORY": 100 * 10**9 * UNIT, "gpu0": UNIT}


def test_env_per_name_does_not_clash_with_a_lower_case_name_of_the_same_letters():
    env = {"ZRES_AGENT__RESOURCES__GPU": "2", "ZRES_AGENT__RESOURCES__gpu": "1"}
    assert load("agent", environ=env)["resources"] == {"GPU": 2 * UNIT, "gpu": UNIT}


def test_resources_merge_by_name_across_layers(tmp_path):
    conf = write(tmp_path / "z.toml", "[agent]\nresources = 'GPU=4 foo=1 bar=1'\n")
    env = {"ZRES_AGENT__RESOURCES": "GPU=2 foo=3"}
    got = load("agent", {"resources": "GPU=1"}, path=conf, environ=env)
    assert got["resources"] == {"GPU": UNIT, "foo": 3 * UNIT, "bar": UNIT}


def test_flag_resources_override_env_per_name():
    env = {"ZRES_AGENT__RESOURCES__GPU": "2"}
    got = load("agent", {"resources": "GPU=1 x=1"}, environ=env)
    assert got["resources"] == {"GPU": UNIT, "x": UNIT}


# -- bad values --------------------------------------------------------------------------


def test_bad_env_number_names_the_setting_and_the_environment():
    with pytest.raises(ConfigError) as info:
        load("agent", environ={"ZRES_AGENT__NTHREADS": "four"})
    message = str(info.value)
    assert "environment" in message and "nthreads" in message and "four" in message


def test_bad_flag_names_the_command_line():
    with pytest.raises(ConfigError, match="command line.*nworkers"):
        load("agent", {"nworkers": 0}, environ={})


def test_bad_file_value_names_the_file(tmp_path):
    conf = write(tmp_path / "my.toml", "[broker]\nheartbeat_interval = -1\n")
    with pytest.raises(ConfigError, match="my.toml.*heartbeat_interval"):
        load("broker", path=conf, environ={})


def test_bad_env_resource_spec_names_the_environment_and_the_part():
    with pytest.raises(ConfigError) as info:
        load("agent", environ={"ZRES_AGENT__RESOURCES": "GPU=2 foo"})
    message = str(info.value)
    assert message.startswith("environment: ")
    assert "invalid resource spec 'foo'" in message
    assert "\n" not in message


def test_bad_env_per_name_resource_names_the_environment():
    with pytest.raises(ConfigError, match="environment.*GPU.*'x'"):
        load("agent", environ={"ZRES_AGENT__RESOURCES__GPU": "x"})
    with pytest.raises(ConfigError, match="environment.*1x"):
        load("agent", environ={"ZRES_AGENT__RESOURCES__1x": "1"})


def test_bad_flag_resource_spec_names_the_command_line():
    with pytest.raises(ConfigError, match="command line: invalid resource spec 'GPU=-1'"):
        load("agent", {"resources": "GPU=-1"}, environ={})


def test_bad_file_resources_name_the_file(tmp_path):
    conf = write(tmp_path / "r.toml", "[agent.resources]\nGPU = 'lots'\n")
    with pytest.raises(ConfigError, match="r.toml.*GPU"):
        load("agent", path=conf, environ={})
    conf = write(tmp_path / "s.toml", "[agent]\nresources = 3\n")
    with pytest.raises(ConfigError, match="s.toml.*resources"):
        load("agent", path=conf, environ={})


def test_unknown_setting_is_an_error_naming_where_it_came_from(tmp_path):
    with pytest.raises(ConfigError, match="environment.*agent.bogus"):
        load("agent", environ={"ZRES_AGENT__BOGUS": "1"})
    conf = write(tmp_path / "u.toml", "[broker]\nlisen = 'tcp://x:1'\n")
    with pytest.raises(ConfigError, match="u.toml.*broker.lisen"):
        load("broker", path=conf, environ={})


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        load("agent", {"nthreads": "many"}, environ={})


@pytest.mark.parametrize("value", ["nan", "NaN"])
def test_nan_durations_are_refused(value):
    """NaN is not positive; a NaN heartbeat interval must not be accepted."""
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        load("broker", environ={"ZRES_BROKER__HEARTBEAT_INTERVAL": value})


def test_infinite_starvation_after_is_allowed():
    got = load("broker", environ={"ZRES_BROKER__STARVATION_AFTER": "inf"})
    assert math.isinf(got["starvation_after"])


def test_fractional_counts_in_the_file_are_refused_not_truncated(tmp_path):
    conf = write(tmp_path / "f.toml", "[agent]\nnthreads = 2.5\n")
    with pytest.raises(ConfigError, match="f.toml.*nthreads"):
        load("agent", path=conf, environ={})


def test_boolean_counts_in_the_file_are_refused(tmp_path):
    conf = write(tmp_path / "b.toml", "[agent]\nnworkers = true\n")
    with pytest.raises(ConfigError, match="b.toml.*nworkers"):
        load("agent", path=conf, environ={})


def test_the_state_directory_comes_from_the_flag_env_file_or_the_port(tmp_path):
    conf = write(tmp_path / "s.toml", "[broker]\nstate = '/from/file'\n")
    assert load("broker", path=conf, environ={})["state"] == "/from/file"
    env = {"ZRES_STATE_DIR": "/from/env", "XDG_STATE_HOME": "/xdg"}
    assert load("broker", path=conf, environ=env)["state"] == "/from/env"
    assert load("broker", {"state": "/flag"}, path=conf, environ=env)["state"] == "/flag"
    assert load("broker", environ={"XDG_STATE_HOME": "/xdg"})["state"] == \
        "/xdg/zres/broker-7070"
    assert load("broker", {"listen": "tcp://127.0.0.1:0"}, environ={})["state"] is None
    bad = write(tmp_path / "b.toml", "[broker]\nstate = 5\n")
    with pytest.raises(ConfigError, match="b.toml: state must be a non-empty string"):
        load("broker", path=bad, environ={})


@pytest.mark.parametrize("text", [
    "[agent]\nname = 5", "[agent]\nname = ''", "[agent]\njob_logs = 5",
    "[agent]\nstate = 5", "[agent]\ndata_listen = 5", "[agent]\ndata_advertise = ' '",
    "[broker]\nstate = ''", "[broker]\nrelay_listen = 5", "[security]\nkeys = 5",
    "[security]\nkeys = ''"])
def test_names_paths_and_addresses_are_refused_unless_non_empty_strings(text, tmp_path):
    """(A number crashed the agent with a traceback; an empty string was quietly the
    default.)"""
    section, key = text[1:].split("]")[0], text.split("\n")[1].split(" ")[0]
    conf = write(tmp_path / "n.toml", text + "\n")
    with pytest.raises(ConfigError, match=f"n.toml: {key} must be a non-empty string"):
        load(section, path=conf, environ={})
    with pytest.raises(ConfigError, match=f"environment: {key} must be a non-empty string"):
        load(section, environ={f"ZRES_{section.upper()}__{key.upper()}": ""})


@pytest.mark.parametrize("section, text, says", [
    ("broker", "[brokr]\nlisten = 'tcp://127.0.0.1:1'", r"unknown section \[brokr\]"),
    ("agent", "broker = 'tcp://127.0.0.1:1'", r"broker must be a section \(\[broker\]\)"),
    ("security", "[security]\ninsecure = 'maybe'", "insecure must be true or false"),
])
def test_a_misspelt_section_or_a_wrong_kind_of_value_is_refused(section, text, says,
                                                                 tmp_path):
    """(A misspelt section was ignored, a value where a section belongs crashed with a
    traceback, and an insecure that is not a boolean was quietly false.)"""
    conf = write(tmp_path / "m.toml", text + "\n")
    with pytest.raises(ConfigError, match=f"m.toml: {says}"):
        load(section, path=conf, environ={})


def test_a_heartbeat_timeout_must_be_longer_than_the_interval():
    """(Else every peer is lost between two of its heartbeats.)"""
    with pytest.raises(ConfigError, match=r"heartbeat_timeout \(3.0\) must be longer than "
                       r"heartbeat_interval \(5.0\)"):
        load("agent", environ={"ZRES_AGENT__HEARTBEAT_INTERVAL": "5"})


# -- fair share and quotas ---------------------------------------------------------------


def test_the_fairshare_half_life_defaults_to_hours_and_must_be_finite():
    assert load("broker", environ={})["fairshare_half_life"] == 4 * 3600.0
    got = load("broker", environ={"ZRES_BROKER__FAIRSHARE_HALF_LIFE": "600"})
    assert got["fairshare_half_life"] == 600.0
    for bad in ("inf", "0", "-5", "soon"):
        with pytest.raises(ConfigError, match="environment: fairshare_half_life must be"):
            load("broker", environ={"ZRES_BROKER__FAIRSHARE_HALF_LIFE": bad})


def test_job_log_retention_defaults_to_a_week_and_must_be_positive_seconds(tmp_path):
    """(0 is refused, not "remove at once": a log removed as its job ends could not be read
    by ``zres logs``, nor finished by a ``--follow``; inf keeps logs for ever.)"""
    assert load("agent", environ={})["job_log_retention"] == 7 * 24 * 3600.0
    assert load("agent", environ={})["job_log_max_bytes"] is None
    got = load("agent", environ={"ZRES_AGENT__JOB_LOG_RETENTION": "3600"})
    assert got["job_log_retention"] == 3600.0
    assert math.isinf(load("agent", {"job_log_retention": "inf"},
                           environ={})["job_log_retention"])
    conf = write(tmp_path / "r.toml", "[agent]\njob_log_retention = 86400\n"
                 "job_log_max_bytes = '10GiB'\n")
    got = load("agent", path=conf, environ={})
    assert (got["job_log_retention"], got["job_log_max_bytes"]) == (86400.0, "10GiB")
    for bad in ("0", "-5", "nan", "a week", ""):
        with pytest.raises(ConfigError, match="environment: job_log_retention must be a "
                                              f"positive float, got '{bad}'"):
            load("agent", environ={"ZRES_AGENT__JOB_LOG_RETENTION": bad})
    bad_file = write(tmp_path / "b.toml", "[agent]\njob_log_retention = true\n")
    with pytest.raises(ConfigError, match="b.toml: job_log_retention must be a positive"):
        load("agent", path=bad_file, environ={})


def test_the_brokers_spin_is_its_default_zero_or_finite_seconds():
    assert load("broker", environ={})["spin"] is None  # (zres.broker.spinning's default)
    assert load("broker", environ={"ZRES_BROKER__SPIN": "0"})["spin"] == 0.0
    assert load("broker", environ={"ZRES_BROKER__SPIN": "0.0005"})["spin"] == 0.0005
    for bad in ("inf", "-0.001", "nan", "fast"):
        with pytest.raises(ConfigError, match="environment: spin must be a non-negative"):
            load("broker", environ={"ZRES_BROKER__SPIN": bad})
    for huge in ("10", "0.5"):  # (seconds: it would spin on a core between heartbeats)
        with pytest.raises(ConfigError, match=f"environment: spin must be at most 0.1, got "
                                              f"'{huge}'"):
            load("broker", environ={"ZRES_BROKER__SPIN": huge})
    assert load("broker", environ={"ZRES_BROKER__SPIN": "0.1"})["spin"] == 0.1


def test_quotas_come_from_the_file_and_the_environment_per_owner(tmp_path):
    conf = write(tmp_path / "q.toml", '[quotas]\nAlice = "GPU=4"\nbob = "GPU=1 CPU=8"\n'
                 'default = { GPU = 2 }\n[quotas.queued]\nAlice = 100_000\ndefault = 5\n')
    got = quotas(path=conf, environ={})
    assert got.hold == {"Alice": {"GPU": 4 * UNIT}, "bob": {"GPU": UNIT, "CPU": 8 * UNIT}}
    assert got.default_hold == {"GPU": 2 * UNIT}
    assert got.queued == {"Alice": 100_000} and got.default_queued == 5
    assert got.hold_of("carol") == {"GPU": 2 * UNIT} and got.queued_of("carol") == 5
    env = {"ZRES_QUOTAS__BOB": "GPU=3", "ZRES_QUOTAS__QUEUED__CAROL": "7"}
    got = quotas(path=conf, environ=env)
    assert got.hold["bob"] == {"GPU": 3 * UNIT} and got.queued["carol"] == 7
    empty = quotas(environ={})
    assert (empty.hold, empty.queued, empty.default_hold, empty.default_queued) == \
        ({}, {}, None, None)


@pytest.mark.parametrize(("text", "env", "error"), [
    ('[quotas]\nalice = "GPU=x"\n', {}, r"q.toml: quotas.alice: invalid resource spec"),
    ('[quotas]\nalice = 4\n', {}, r"q.toml: quotas.alice must be resources like"),
    ('[quotas]\nqueued = 5\n', {}, r"q.toml: quotas.queued must be a table"),
    ('[quotas.queued]\nalice = -1\n', {}, r"q.toml: quotas.queued.alice must be a whole"),
    ('[quotas.queued]\nalice = 2.5\n', {}, r"quotas.queued.alice must be a whole number"),
    ("", {"ZRES_QUOTAS__QUEUED__ALICE": "lots"},
     r"environment: quotas.queued.alice must be a whole number of tasks"),
    ("", {"ZRES_QUOTAS__ALICE": "GPU=-1"}, r"environment: quotas.alice: "),
])
def test_bad_quotas_are_refused_naming_the_quota_and_where_it_came_from(tmp_path, text, env,
                                                                        error):
    conf = write(tmp_path / "q.toml", text)
    with pytest.raises(ConfigError, match=error):
        quotas(path=conf, environ=env)


def test_the_brokers_http_request_timeout_is_positive_finite_seconds():
    assert load("broker", environ={})["http_request_timeout"] == 5.0
    got = load("broker", environ={"ZRES_BROKER__HTTP_REQUEST_TIMEOUT": "30"})
    assert got["http_request_timeout"] == 30.0
    for bad in ("0", "-1", "inf", "nan", "soon"):  # (for ever: a connection never closed)
        with pytest.raises(ConfigError, match="environment: http_request_timeout must be a "
                           "positive float"):
            load("broker", environ={"ZRES_BROKER__HTTP_REQUEST_TIMEOUT": bad})
