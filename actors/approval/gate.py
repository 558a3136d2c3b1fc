"""Approval that waits for the person (docs/approval.md): the approver and the gate.

**The approver** is supplied by whoever drives the turn (the chat prompt, ``loopd run``'s
``--json`` or no-terminal answers, a daemon client forwarding the question over its
socket). It is any callable::

    approver(request: ApprovalRequested, cancel: CancelToken, deadline: float) -> Decision | None

- It is called in the session actor's thread, which waits for it; everything else the turn
  does (records, limits) stays in the session actor. ``request`` is also emitted to the
  turn's sink just before, so a view can show it with the rest of the turn.
- It returns a :class:`Decision`: ``ONCE`` (allow this call), ``SESSION`` (allow this and
  the calls ``request.rule`` matches for the rest of the session, kept in the log and
  re-read when the session reopens), ``ALWAYS`` (the same, saved as a rule in the rules
  file for every session), ``DENY`` with an optional ``reason`` the model reads, or
  ``NEVER`` (deny, and save ``request.rule`` as a deny rule in the rules file: the calls it
  matches are refused from then on, in every session, without asking).
  ``SESSION``/``ALWAYS`` on a request whose ``rule`` is empty count as ``ONCE``, ``NEVER``
  as ``DENY``.
- It returns None when no answer came: by ``deadline`` (a ``time.monotonic()`` value,
  ``math.inf`` for no limit; a remote approver sends ``deadline - time.monotonic()`` as
  seconds), or as soon as ``cancel`` is set (Ctrl-C, a client gone). It must not block past
  either. The gate turns None into a denial that says no answer came in time, or into
  :class:`~actors.base.errors.Cancelled` when the token is set: then nothing runs.

**The gate** (:class:`Gate`) is what the turn calls for every call that goes to a tool
host. A deny rule stops the call before it is sent. Otherwise the call is sent; when the
host answers ``PendingApproval``, an allow rule, an earlier "for this session" answer, or
the approver decides, and an allowed call is sent again with ``approved`` set. A write is
decided on where it lands (the host's ``landing``: symlinks walked), never on the words of
its path, and sent again approved for that landing only; a protected landing (``.git``, a
``loopd.toml``) is asked of the approver whatever the rules or earlier answers say. Every
decision is an :class:`~actors.log.records.Approval` record, appended before the call's
ToolResult, and an :class:`~actors.base.events.ApprovalDecided` event.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from actors.approval.rulesfile import RuleStore
from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.config import ToolsConfig
from actors.base.errors import Cancelled, RulesError
from actors.base.events import (
    NO_APPROVER,
    ApprovalDecided,
    ApprovalRequested,
    Approver,
    Choice,
    Decision,
    ElicitationAnswered,
    ElicitationRequested,
    Elicitor,
    Event,
    ToolProgress,
)
from actors.base.rules import Rule, RuleBook, Verdict, grant_for, parse_rule, verdict
from actors.log.records import Approval, ApprovalDecision, ApprovalScope, Record
from actors.tools.protocol import wire

__all__ = ["Gate", "session_grants"]

def session_grants(records: Iterable[Record]) -> tuple[Rule, ...]:
    """The rules granted by "for this session" answers in the log (whoever answered: the
    person, a remote client, a harness; not the records of the grants being used). A grant
    is what the person saw: a prefix grant an older loopd wrote is read as exact."""
    grants = []
    for r in records:
        if (isinstance(r, Approval) and r.decision is ApprovalDecision.ALLOW
                and r.scope is ApprovalScope.SESSION and r.by != "session" and r.rule):
            try:
                rule = parse_rule(r.rule)
            except ValueError:  # a rule this version no longer reads: ask again
                continue
            grants.append(rule if rule.prefix is None else dataclasses.replace(rule, exact=True))
    return tuple(grants)


# send the call: approved?, and where the approved write lands ("": no landing named)
Send = Callable[[bool, str], wire.Answer]


class Gate:
    """Rules, earlier answers and the approver between one turn's calls and the tool hosts."""

    def __init__(
        self,
        *,
        tools: ToolsConfig,
        store: RuleStore,
        records: Callable[[], tuple[Record, ...]],
        append: Callable[[Record], None],
        emit: Callable[[Event], None],
        approver: Approver | None,
        cancel: CancelToken,
    ) -> None:
        self.tools, self.store = tools, store
        self.records, self.append, self.emit = records, append, emit
        self.approver, self.cancel = approver, cancel

    def run(self, call: int, tool: str, arguments: Mapping[str, Any], send: Send) -> wire.Answer:
        """The host's answer to the call, after whatever approval it needed."""
        stored, problem = self.store.current()  # the rules file as it is on disk now
        rules = RuleBook.of(self.tools.allow, self.tools.deny) + stored
        said, rule = verdict(rules, tool, arguments)
        if said is Verdict.DENY:
            reason = f'the rule "{rule}" (tools.deny or the rules file) forbids it'
            self._decide(call, tool, ApprovalDecision.DENY, ApprovalScope.ALWAYS, "rule",
                         reason, str(rule))
            return wire.Denied(reason=reason)
        # a rules file gone bad: its deny rules unknown, no rule or earlier answer allows
        why = (f"{problem}; until it is fixed no rule allows a call: each that needs approval "
               "is asked" if problem else "")
        answer = send(False, "")
        if not isinstance(answer, wire.PendingApproval):
            return answer
        landing = answer.landing
        if landing:  # the rules reach where the write lands, not the words of its path
            arguments = {**arguments, "path": landing}
            said, rule = verdict(rules, tool, arguments)
            if said is Verdict.DENY:
                reason = (f'it writes {landing}, which the rule "{rule}" (tools.deny or the '
                          "rules file) forbids")
                self._decide(call, tool, ApprovalDecision.DENY, ApprovalScope.ALWAYS, "rule",
                             reason, str(rule))
                return wire.Denied(reason=reason)
        if not why and self._allowed(call, tool, arguments, answer, rules, said, rule):
            done = send(True, landing)
        elif why:
            done = self._ask(call, tool, arguments, f"loopd: {why}\n{answer.prompt}", None,
                             send, landing, why)
        else:
            done = self._ask(call, tool, arguments, answer.prompt,
                             grant_for(rules, tool, arguments), send, landing)
        if isinstance(done, wire.PendingApproval):  # the write would land elsewhere now
            return wire.Denied(reason=(
                f"where the write lands changed while it was approved ({landing or 'its path'}"
                f" -> {done.landing}); nothing was written: call it again"))
        return done

    def asker(self, call: int, tool: str) -> wire.Questions:
        """How call ``call`` asks the person a question mid-call (an MCP server's
        elicitation), through the approver's ``elicit`` (none when it has none: nobody to
        ask, the tool host answers by ``tools.elicitation``), and where its progress goes
        (a :class:`ToolProgress` event)."""

        def progress(said: wire.Progress) -> None:
            self.emit(ToolProgress(call=call, tool=tool, done=said.done, total=said.total,
                                   message=said.message))

        timeout = self.tools.approval_timeout_s
        if getattr(self.approver, "elicit", None) is None:
            return wire.Questions(None, timeout, progress)
        elicitor = typing.cast(Elicitor, self.approver)

        def ask(question: wire.Ask, deadline: float) -> tuple[str, dict[str, Any]]:
            request = ElicitationRequested(
                call=call, tool=tool, server=question.server, message=question.message,
                fields=json.dumps(question.schema, ensure_ascii=False), timeout_s=timeout)
            self.emit(request)
            answer = elicitor.elicit(request, self.cancel, deadline)
            if answer is None:
                by = "cancel" if self.cancel.cancelled else "timeout"
                self.emit(ElicitationAnswered(call=call, tool=tool, action="cancel", by=by))
                return "cancel", {}
            self.emit(ElicitationAnswered(call=call, tool=tool, action=answer.action))
            return answer.action, answer.content

        return wire.Questions(ask, timeout, progress)

    def _allowed(
        self, call: int, tool: str, arguments: Mapping[str, Any], pending: wire.PendingApproval,
        rules: RuleBook, said: Verdict, rule: Rule | None,
    ) -> bool:
        """True when a rule or an earlier answer allows the call (recorded); False: ask. A
        protected write (the host said why) is always asked for."""
        if pending.protected:
            return False
        if said is Verdict.ALLOW:
            if not _standing(rule, self.tools, rules):
                self._decide(call, tool, ApprovalDecision.ALLOW, ApprovalScope.ALWAYS,
                             "rule", "", str(rule))
            return True
        granted = RuleBook(session_grants(self.records()), rules.deny)
        said, rule = verdict(granted, tool, arguments)
        if said is Verdict.ALLOW:
            self._decide(call, tool, ApprovalDecision.ALLOW, ApprovalScope.SESSION, "session",
                         "", str(rule))
            return True
        return False

    def _ask(
        self, call: int, tool: str, arguments: Mapping[str, Any], prompt: str,
        grant: Rule | None, send: Send, landing: str, why: str = "",
    ) -> wire.Answer:
        """Ask the approver; ``why`` (why it was asked: a broken rules file) goes with the
        person's decision, in its reason."""
        timeout = self.tools.approval_timeout_s
        request = ApprovalRequested(
            call=call, tool=tool, arguments=json.dumps(arguments, ensure_ascii=False),
            prompt=prompt, rule="" if grant is None else str(grant), timeout_s=timeout,
        )
        self.emit(request)
        asked = time.monotonic()
        deadline = asked + timeout if timeout > 0 else math.inf
        if self.approver is None:
            decision: Decision | None = Decision(Choice.DENY, NO_APPROVER, by="no approver")
        else:
            decision = self.approver(request, self.cancel, deadline)
        telemetry.current().event("loopd.approval_wait", {  # on the call's execute_tool span
            "loopd.approval.wait_ms": round((time.monotonic() - asked) * 1000, 3),
            "loopd.approval.choice": decision.choice.value if decision else "no answer"})
        once = ApprovalScope.ONCE
        if self.cancel.cancelled:
            self._decide(call, tool, ApprovalDecision.DENY, once, "cancel",
                         "the turn was cancelled while waiting for approval", "")
            raise Cancelled()
        if decision is None:
            reason = (f"no answer within {timeout:g} s (tools.approval_timeout_s), so it did "
                      "not run")
            self._decide(call, tool, ApprovalDecision.DENY, once, "timeout", reason, "")
            return wire.Denied(reason=reason)
        if decision.choice in (Choice.DENY, Choice.NEVER):
            said = decision.reason.strip()
            reason = f"the person said no: {said}" if said else "the person said no"
            if decision.by != "person":
                reason = said or f"denied ({decision.by})"
            scope, rule = once, ""
            if decision.choice is Choice.NEVER and grant is not None:
                scope, rule, note = self._keep(grant, deny=True)
                reason = f"{reason}; {note}" if note else reason
            reason = f"{reason}; {why}" if why else reason
            self._decide(call, tool, ApprovalDecision.DENY, scope, decision.by, reason, rule)
            return wire.Denied(reason=reason)
        scope, rule, note = _SCOPES[decision.choice], "", ""
        if grant is None:
            scope = once
        elif scope is ApprovalScope.ALWAYS:
            scope, rule, note = self._keep(grant, deny=False)
        elif scope is ApprovalScope.SESSION:
            rule = str(grant)
        note = "; ".join(n for n in (note, why) if n)
        self._decide(call, tool, ApprovalDecision.ALLOW, scope, decision.by, note, rule)
        return send(True, landing)

    def _keep(self, grant: Rule, *, deny: bool) -> tuple[ApprovalScope, str, str]:
        """An "always" (allow) or "never" (deny) answer saved as a rule: its scope, rule and
        a note. A rule that cannot be saved holds for this session only (an allow: the log
        keeps it) or for this call only (a deny), and the note says why."""
        try:
            self.store.save(grant, deny=deny)
        except RulesError as e:
            if deny:
                return ApprovalScope.ONCE, "", f"not saved as a rule: {e}"
            return ApprovalScope.SESSION, str(grant), f"kept for this session only: {e}"
        return ApprovalScope.ALWAYS, str(grant), ""

    def _decide(
        self, call: int, tool: str, decision: ApprovalDecision, scope: ApprovalScope, by: str,
        reason: str, rule: str,
    ) -> None:
        record = Approval(call=call, tool=tool, decision=decision, scope=scope, by=by,
                          reason=reason, rule=rule)
        self.append(record)
        self.emit(ApprovalDecided(call=call, tool=tool, decision=decision.value,
                                  scope=scope.value, by=by, reason=reason, rule=rule))


def _standing(rule: Rule | None, tools: ToolsConfig, rules: RuleBook) -> bool:
    """True for a whole tool the config's ``tools.allow`` names, no deny rule naming it:
    standing policy, run without a record (as when tool hosts were given it)."""
    return (rule is not None and rule.prefix is None and rule in RuleBook.of(tools.allow).allow
            and not any(d.tool == rule.tool for d in rules.deny))


_SCOPES = {Choice.ONCE: ApprovalScope.ONCE, Choice.SESSION: ApprovalScope.SESSION,
           Choice.ALWAYS: ApprovalScope.ALWAYS}
