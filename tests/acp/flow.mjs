// The official ACP TypeScript SDK's client (@agentclientprotocol/sdk, pinned in
// package-lock.json) drives `loopd acp` through a whole session: a tool call, each approval
// answer, a cancel mid-turn, every stop reason, then a second `loopd acp` process that
// loads the session, receives its history and forks it (session/fork, from the SDK's
// unstable entry point), and prompts the fork. Run by tests/acp/test_node_client.py:
//
//   node flow.mjs   with LOOPD_ACP = {"argv": [...], "cwd": ..., "workspace": ..., "stderr": ...}
//
// Every check is an assertion here (a failure exits non-zero with its message); the last
// line on stdout is a JSON summary the Python side checks against the log and rules file.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { Readable, Writable } from "node:stream";

import * as acp from "@agentclientprotocol/sdk";
import * as unstable from "@agentclientprotocol/sdk/unstable";

const setup = JSON.parse(process.env.LOOPD_ACP);
const guard = setTimeout(() => {
  console.error("flow.mjs: no end after 280 s");
  process.exit(3);
}, 280_000);

function order(tag, ...steps) {
  return [tag, ...steps.map(([name, args]) => `${name} ${JSON.stringify(args)}`)].join(" :: ");
}
const write = (p, content) => ["write_file", { path: p, content }];
const run = (command) => ["run_command", { command }];
const textOf = (updates) =>
  updates.filter((u) => u.sessionUpdate === "agent_message_chunk").map((u) => u.content.text).join("");
const statuses = (updates) =>
  updates
    .filter((u) => u.sessionUpdate === "tool_call" || u.sessionUpdate === "tool_call_update")
    .map((u) => `${u.sessionUpdate}:${u.status ?? ""}`);

// One `loopd acp` process and a client connected to it; `op(ctx, editor)` runs the session.
async function withAgent(op, argv = setup.argv) {
  const err = fs.openSync(setup.stderr, "a");
  const child = spawn(argv[0], argv.slice(1), {
    cwd: setup.cwd,
    stdio: ["pipe", "pipe", err],
  });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  const editor = { updates: [], asked: [], answers: [], onUpdate: null };
  const app = acp
    .client({ name: "loopd-acp-test" })
    .onNotification(acp.methods.client.session.update, async ({ params, agent }) => {
      editor.updates.push(params.update);
      if (editor.onUpdate) await editor.onUpdate(params, agent);
    })
    .onRequest(acp.methods.client.session.requestPermission, async ({ params }) => {
      editor.asked.push(params);
      const kind = editor.answers.shift();
      const option = params.options.find((o) => o.kind === kind);
      assert.ok(option, `no ${kind} option in ${JSON.stringify(params.options)}`);
      return { outcome: { outcome: "selected", optionId: option.optionId } };
    });
  let result;
  try {
    result = await app.connectWith(stream, (ctx) => op(ctx, editor));
  } finally {
    child.stdin.end();
  }
  const end = await exited;
  fs.closeSync(err);
  assert.deepEqual(end, { code: 0, signal: null }, "loopd acp did not end cleanly");
  return result;
}

async function initialize(ctx, session = undefined) {
  const init = await ctx.request(acp.methods.agent.initialize, {
    protocolVersion: acp.PROTOCOL_VERSION,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false, session },
    clientInfo: { name: "loopd-acp-test", version: "1" },
  });
  assert.equal(init.protocolVersion, 1);
  assert.equal(init.agentCapabilities.loadSession, true);
  assert.equal(init.agentInfo.name, "loopd");
  assert.equal(init.agentCapabilities.promptCapabilities.image, false);
  assert.deepEqual(init.agentCapabilities.sessionCapabilities,
                   { list: {}, delete: {}, fork: {}, resume: {}, close: {} });
  return init;
}

const sessionId = await withAgent(async (ctx, editor) => {
  await initialize(ctx);
  const { sessionId } = await ctx.request(acp.methods.agent.session.new, {
    cwd: setup.workspace,
    mcpServers: [],
  });
  const prompt = async (text) => {
    const mark = editor.updates.length;
    const done = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId,
      prompt: [{ type: "text", text }],
    });
    return [done.stopReason, editor.updates.slice(mark)];
  };

  // a tool call that needs no approval: pending, then completed with the result as content
  let [reason, updates] = await prompt(order("t1", ["read_file", { path: "notes.txt" }]));
  assert.equal(reason, "end_turn");
  assert.equal(editor.asked.length, 0);
  const call = updates.find((u) => u.sessionUpdate === "tool_call");
  assert.equal(call.title, "read_file notes.txt");
  assert.equal(call.kind, "read");
  assert.equal(call.status, "pending");
  assert.equal(call.locations[0].path, path.join(setup.workspace, "notes.txt"));
  const result = updates.filter((u) => u.sessionUpdate === "tool_call_update").at(-1);
  assert.equal(result.status, "completed");
  assert.equal(result.content[0].content.text, "Buy seeds.\n");
  assert.equal(textOf(updates), "done t1.");

  // allow once
  editor.answers.push("allow_once");
  [reason, updates] = await prompt(order("t2", write("a.txt", "one")));
  assert.equal(reason, "end_turn");
  assert.equal(editor.asked.length, 1);
  assert.deepEqual(
    editor.asked[0].options.map((o) => o.kind),
    ["allow_once", "allow_always", "reject_once", "reject_always"],
  );
  assert.equal(editor.asked[0].toolCall.title, "write_file a.txt");
  assert.deepEqual(statuses(updates), ["tool_call:pending", "tool_call_update:in_progress",
                                       "tool_call_update:completed"]);
  assert.equal(fs.readFileSync(path.join(setup.workspace, "a.txt"), "utf8"), "one");

  // allow always: saved as a rule, so the next such call is not asked
  editor.answers.push("allow_always");
  [reason] = await prompt(order("t3", run("touch made.txt")));
  assert.equal(reason, "end_turn");
  assert.equal(editor.asked.length, 2);
  fs.unlinkSync(path.join(setup.workspace, "made.txt"));
  [reason] = await prompt(order("t4", run("touch made.txt")));
  assert.equal(editor.asked.length, 2, "asked again after allow always");
  assert.ok(fs.existsSync(path.join(setup.workspace, "made.txt")));

  // reject once; reject always (a deny rule: the next such call is refused unasked)
  editor.answers.push("reject_once", "reject_always");
  [reason, updates] = await prompt(order("t5", write("b.txt", "no")));
  assert.equal(reason, "end_turn");
  assert.equal(statuses(updates).at(-1), "tool_call_update:failed");
  assert.ok(!fs.existsSync(path.join(setup.workspace, "b.txt")));
  await prompt(order("t6", run("rm notes.txt")));
  [reason, updates] = await prompt(order("t7", run("rm notes.txt")));
  assert.equal(editor.asked.length, 4, "asked again after reject always");
  assert.equal(statuses(updates).at(-1), "tool_call_update:failed");
  assert.ok(fs.existsSync(path.join(setup.workspace, "notes.txt")));

  // a cancel mid-turn: the answer has begun when the client cancels
  editor.onUpdate = async (params, agent) => {
    if (params.update.sessionUpdate === "agent_message_chunk") {
      editor.onUpdate = null;
      await agent.notify(acp.methods.agent.session.cancel, { sessionId: params.sessionId });
    }
  };
  [reason, updates] = await prompt("t8 [stall]");
  assert.equal(reason, "cancelled");
  assert.ok(textOf(updates).length > 0, "the answer had not begun");

  // every other stop reason
  [reason] = await prompt("t9 [long]");
  assert.equal(reason, "max_tokens");
  const looping = [0, 1, 2, 3].map((i) => ["find_tool", { query: `q${i}` }]);
  [reason] = await prompt(order("t10", ...looping));
  assert.equal(reason, "max_turn_requests");
  [reason, updates] = await prompt(order("t11", ...Array(3).fill(["read_file", { path: "notes.txt" }])));
  assert.equal(reason, "max_turn_requests");
  assert.equal(statuses(updates).at(-1), "tool_call_update:failed");

  const listed = await ctx.request(acp.methods.agent.session.list, {});
  assert.ok(listed.sessions.some((s) => s.sessionId === sessionId));
  return sessionId;
});

// a second process loads the session: its history arrives as session/update notifications
const history = await withAgent(async (ctx, editor) => {
  await initialize(ctx);
  await ctx.request(acp.methods.agent.session.load, {
    sessionId,
    cwd: setup.workspace,
    mcpServers: [],
  });
  const replayed = editor.updates.slice();
  const done = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text: "t12" }],
  });
  assert.equal(done.stopReason, "end_turn");
  assert.equal(textOf(editor.updates.slice(replayed.length)), "done t12.");

  // session/fork (unstable in ACP): a new session with the whole conversation; the fork
  // goes on on its own, and the source is not touched
  const forked = await ctx.request(unstable.methods.agent.session.fork, {
    sessionId,
    cwd: setup.workspace,
    mcpServers: [],
  });
  assert.notEqual(forked.sessionId, sessionId);
  assert.equal(forked._meta.loopd.forkedFrom, sessionId);
  assert.equal(forked._meta.loopd.atTurn, 12);
  const mark = editor.updates.length;
  const next = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: forked.sessionId,
    prompt: [{ type: "text", text: "t13" }],
  });
  assert.equal(next.stopReason, "end_turn");
  assert.equal(textOf(editor.updates.slice(mark)), "done t13.");
  return replayed;
});

const users = history.filter((u) => u.sessionUpdate === "user_message_chunk").map((u) => u.content.text);
assert.equal(users.length, 11);
assert.equal(users[0], order("t1", ["read_file", { path: "notes.txt" }]));
const firstResult = history.find((u) => u.sessionUpdate === "tool_call_update");
assert.equal(firstResult.status, "completed");
assert.equal(firstResult.content[0].content.text, "Buy seeds.\n");
assert.ok(textOf(history).includes("done t1."));

// the stable lifecycle in a third process: close (twice), resume without a replay and warm,
// delete; bad input answered and nothing lost
const lifecycle = await withAgent(async (ctx, editor) => {
  const caps = (await initialize(ctx)).agentCapabilities.sessionCapabilities;
  assert.ok(caps.resume && caps.close && caps.delete, `not declared: ${JSON.stringify(caps)}`);
  const { sessionId: life } = await ctx.request(acp.methods.agent.session.new, {
    cwd: setup.workspace,
    mcpServers: [],
  });
  const prompt = async (text) => {
    const mark = editor.updates.length;
    const done = await ctx.request(acp.methods.agent.session.prompt, {
      sessionId: life,
      prompt: [{ type: "text", text }],
    });
    return [done.stopReason, editor.updates.slice(mark)];
  };
  const usageOf = (updates) => {
    const seen = updates.filter((u) => u.sessionUpdate === "usage_update");
    assert.equal(seen.length, 1, "one usage_update for the turn's one request");
    assert.ok(seen[0].used > 0 && seen[0].size >= seen[0].used, JSON.stringify(seen[0]));
    return { used: seen[0].used, size: seen[0].size, ...seen[0]._meta.loopd };
  };
  let [reason, updates] = await prompt("r1 the first message of a session to close");
  assert.equal(reason, "end_turn");
  assert.equal(textOf(updates), "done r1 the first message of a session to close.");
  const before = usageOf(updates);

  // close: the session is no longer open here; twice is "not found", which this SDK
  // answers as an empty result (closing is idempotent for it)
  const closed = await ctx.request(acp.methods.agent.session.close, { sessionId: life });
  assert.equal(closed._meta.loopd.cancelledTurn, false);
  assert.deepEqual(await ctx.request(acp.methods.agent.session.close, { sessionId: life }), {});
  await assert.rejects(
    ctx.request(acp.methods.agent.session.prompt, { sessionId: life, prompt: [{ type: "text", text: "x" }] }),
    /no session .* in this loopd acp/,
  );

  // resume: no history replayed; the next request processes only its own tokens
  const mark = editor.updates.length;
  await ctx.request(acp.methods.agent.session.resume, { sessionId: life, cwd: setup.workspace, mcpServers: [] });
  assert.equal(editor.updates.length, mark, "session/resume replayed updates");
  [reason, updates] = await prompt("r2");
  assert.equal(reason, "end_turn");
  assert.equal(textOf(updates), "done r2.");
  const after = usageOf(updates);
  assert.ok(after.cachedTokens >= before.promptTokens, "resumed cold");

  // fork at a turn (`loopd sessions fork --at`): the fork has the first turn only
  const early = await ctx.request(unstable.methods.agent.session.fork, {
    sessionId: life,
    cwd: setup.workspace,
    mcpServers: [],
    _meta: { loopd: { atTurn: 1 } },
  });
  assert.equal(early._meta.loopd.forkedFrom, life);
  assert.equal(early._meta.loopd.atTurn, 1);
  const forkMark = editor.updates.length;
  const forkDone = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: early.sessionId,
    prompt: [{ type: "text", text: "r3" }],
  });
  assert.equal(forkDone.stopReason, "end_turn");
  assert.equal(textOf(editor.updates.slice(forkMark)), "done r3.");
  for (const [atTurn, why] of [[-1, /atTurn must be a turn number/], ["1", /atTurn must be/],
                               [9, /has turns 1 to 2/]]) {
    await assert.rejects(
      ctx.request(unstable.methods.agent.session.fork, {
        sessionId: life, cwd: setup.workspace, mcpServers: [], _meta: { loopd: { atTurn } },
      }),
      (e) => why.test(e.message),
      `fork at ${JSON.stringify(atTurn)} was not refused`,
    );
  }

  // bad input: resume of a session that does not exist
  await assert.rejects(
    ctx.request(acp.methods.agent.session.resume, { sessionId: "no-such-session", cwd: setup.workspace, mcpServers: [] }),
    (e) => e.code === -32002 && /session no-such-session does not exist/.test(e.message),
  );

  // delete: `loopd sessions rm`; gone from the list, and resuming it is "not found"
  const { sessionId: doomed } = await ctx.request(acp.methods.agent.session.new, {
    cwd: setup.workspace,
    mcpServers: [],
  });
  await ctx.request(acp.methods.agent.session.delete, { sessionId: doomed });
  const listed = await ctx.request(acp.methods.agent.session.list, {});
  assert.ok(!listed.sessions.some((s) => s.sessionId === doomed), "deleted, still listed");
  assert.ok(listed.sessions.some((s) => s.sessionId === life));
  await assert.rejects(
    ctx.request(acp.methods.agent.session.resume, { sessionId: doomed, cwd: setup.workspace, mcpServers: [] }),
    (e) => e.code === -32002,
  );

  // the editor's MCP servers: a stdio server (the official `mcp` SDK's, with the editor's
  // env) started as the session's own tool host, whose tool the model calls; one that does
  // not start is said in the session (after the answer), and the session works
  const [command, ...args] = setup.probe;
  const noteMark = editor.updates.length;
  const withServers = await ctx.request(acp.methods.agent.session.new, {
    cwd: setup.workspace,
    mcpServers: [
      { name: "probe", command, args, env: [{ name: "LOOPD_PROBE", value: "from the editor" }] },
      { name: "gone", command: "/no/such/mcp-server", args: [], env: [] },
    ],
  });
  const servers = withServers._meta.loopd.mcpServers;
  assert.deepEqual(servers.started, ["probe"]);
  assert.deepEqual(servers.tools, ["echo", "env_var", "note"]);
  assert.equal(servers.notes.length, 1);
  assert.match(servers.notes[0], /^MCP server gone: its command '\/no\/such\/mcp-server' was not found/);
  const mcp = withServers.sessionId;
  const mcpDone = await ctx.request(acp.methods.agent.session.prompt, {
    sessionId: mcp,
    prompt: [{ type: "text", text: order("m1", ["env_var", { name: "LOOPD_PROBE" }]) }],
  });
  assert.equal(mcpDone.stopReason, "end_turn");
  const mcpUpdates = editor.updates.slice(noteMark);
  assert.equal(textOf(mcpUpdates.slice(0, 1)), `loopd: ${servers.notes[0]}\n`);
  const mcpResult = mcpUpdates.filter((u) => u.sessionUpdate === "tool_call_update").at(-1);
  assert.equal(mcpResult.status, "completed");
  assert.equal(mcpResult.content[0].content.text, "from the editor");
  await ctx.request(acp.methods.agent.session.close, { sessionId: mcp });
  return { resumed: life, deleted: doomed, usage: [before, after], forkedAt1: early.sessionId, mcp };
});

// compaction (draft ACP): compaction_update for a client that advertised
// session.compaction, nothing for one that did not; a config that compacts early
const compactions = async (session) =>
  withAgent(async (ctx, editor) => {
    await initialize(ctx, session);
    const { sessionId: long } = await ctx.request(acp.methods.agent.session.new, {
      cwd: setup.workspace,
      mcpServers: [],
    });
    for (let i = 0; i < 7; i++) {
      const done = await ctx.request(acp.methods.agent.session.prompt, {
        sessionId: long,
        prompt: [{ type: "text", text: `c${i} ` + "words ".repeat(150) }],
      });
      assert.ok(["end_turn", "max_tokens"].includes(done.stopReason), done.stopReason);
    }
    return editor.updates.filter((u) => u.sessionUpdate === "compaction_update");
  }, setup.argvCompact);
const seen = await compactions({ compaction: {} });
assert.ok(seen.length >= 2, "no compaction_update for a client that opted in");
assert.deepEqual(seen.slice(0, 2).map((u) => u.status), ["in_progress", "completed"]);
assert.equal(seen[0].compactionId, seen[1].compactionId);
assert.ok(seen[1]._meta.loopd.tokensAfter < seen[1]._meta.loopd.tokensBefore, JSON.stringify(seen[1]));
assert.deepEqual(await compactions(undefined), [], "compaction_update sent to a client that did not opt in");

clearTimeout(guard);
console.log(JSON.stringify({ sessionId, replayed: history.length, ...lifecycle, compaction: seen[1] }));
