"""A pytest plugin (the repository's conftest.py loads it for every suite): a test skipped because a module could
not be imported (`pytest.importorskip`, a whole module or one test) fails the run, naming it. A session installs the
references its tests compare with (transformers, peft: the packages' test extras, nox's integration session); a
check that skips where one is missing passes without having compared anything."""

from __future__ import annotations

import pytest

MARK = "could not import"  # pytest.importorskip's reason: "could not import 'x': No module named 'x'"


class ImportSkips:
    def __init__(self) -> None:
        self.skipped: list[str] = []

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if report.skipped and isinstance(report.longrepr, tuple) and MARK in str(report.longrepr[2]):
            self.skipped.append(f"{report.nodeid}: {report.longrepr[2]}")

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._note(report)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.skipped:
            terminalreporter.section("skipped for a missing module: the run fails", red=True)
            for line in self.skipped:
                terminalreporter.line(line)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ImportSkips(), "titan-import-skips")
