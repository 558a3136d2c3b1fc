"""How close the eval's right answers come to the runaway-text limit (docs/turn.md#limits).

The defaults of ``loop.runaway_repeat_tokens`` and ``loop.runaway_copy_tokens`` must cut no
right answer. This runs the watch (:mod:`actors.inference.runaway`, limits off) over:

- every answer and reasoning a real llama-server streamed in ``tests/fixtures/http``, with
  the prompt it answered, chunk by chunk as it came;
- every file of ``examples/eval/workspaces`` as the answer to a request that read it (what
  a right answer to "Show me todo.md." is at most: the file, copied whole), and the file
  alone as an answer (a file that repeats itself, a table say);
- every answer an eval task expects (``answer_all``, ``answer_any``) after its prompt;

and prints the longest repeat and copy runs, in pieces, with where they were seen. Given
eval results (``scripts.eval --out`` files), it also prints the longest run of each right
answer that repeats an earlier answer of its session to another question: what
``loop.runaway_echo_tokens`` must stay above, even before it asks that the earlier answer
copied a tool's result (the results' text is not in those files).

    python -m scripts.runaway_scores [EVAL_RESULTS.json ...]
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from actors.inference.runaway import Watcher
from tests.support import recording

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = ROOT / "tests" / "fixtures" / "http"
EVAL = ROOT / "examples" / "eval"


def peaks(messages: Iterable[Mapping[str, Any]], chunks: Iterable[tuple[str, bool]]
          ) -> tuple[int, int]:
    """The longest repeat and copy runs of the streamed ``chunks`` (text, is reasoning)."""
    watch = Watcher(list(messages), 1 << 62, 1 << 62, lazy=0)  # watched, never cut: measured
    for text, reasoning in chunks:
        watch.feed(text, reasoning)
    return watch.peaks[0], watch.peaks[1]


def _streamed(body: bytes) -> list[tuple[str, bool]]:
    out = []
    for line in body.splitlines():
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        obj = orjson.loads(line[6:])
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            for key, reasoning in (("reasoning_content", True), ("content", False)):
                if isinstance(delta.get(key), str):
                    out.append((delta[key], reasoning))
    return out


def recorded() -> Iterable[tuple[str, tuple[int, int]]]:
    for path in sorted(RECORDINGS.glob("*.http")):
        for n, ex in enumerate(recording.load(path)):
            if not ex.request.path.endswith("/chat/completions"):
                continue
            messages = ex.request.json().get("messages") or []
            yield f"{path.name}#{n}", peaks(messages, _streamed(ex.response.body))


def _chunks(text: str, size: int = 4) -> list[tuple[str, bool]]:
    return [(text[i : i + size], False) for i in range(0, len(text), size)]


def shown_files() -> Iterable[tuple[str, tuple[int, int]]]:
    for path in sorted((EVAL / "workspaces").rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        prompt = [{"role": "user", "content": f"Show me {path.name}."},
                  {"role": "tool", "content": text}]
        yield str(path.relative_to(EVAL)), peaks(prompt, _chunks(text))


def expected() -> Iterable[tuple[str, tuple[int, int]]]:
    for path in sorted(EVAL.glob("*.toml")):
        for task in tomllib.loads(path.read_text()).get("task", []):
            words = [*task.get("answer_all", []), *task.get("answer_any", [])]
            prompt = [{"role": "user", "content": task.get("prompt", "")}]
            yield f"{path.name}:{task.get('id')}", peaks(prompt, _chunks(" ".join(words)))


def echoed(results: Iterable[Path]) -> Iterable[tuple[str, int]]:
    """Each right answer of the eval results against the earlier answers of its session
    (file and way) to other questions: its name and the longest run it repeats."""
    prompts = {t.get("id"): t.get("prompt", "") for path in EVAL.glob("*.toml")
               for t in tomllib.loads(path.read_text()).get("task", [])}
    for path in results:
        earlier: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for row in orjson.loads(path.read_bytes()).get("rows", []):
            if row.get("bench") != "eval":
                continue
            said, asked = row.get("answer") or "", prompts.get(row["task"], "")
            before = earlier.setdefault((row.get("file", ""), row.get("way", "")), [])
            others = [a for q, a in before if q.strip().lower() != asked.strip().lower()]
            if row.get("passed") and others:
                watch = Watcher([], 0, 0, echo=1 << 62, echoes=others)
                watch.feed(said + "\n")
                yield f"{path.name}:{row['task']}", watch.peaks[2]
            before.append((asked, said))


def main(argv: list[str] | None = None) -> int:
    results = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    for title, rows in (("recorded answers", recorded()), ("eval files, shown whole",
                                                           shown_files()),
                        ("eval expected answers", expected())):
        rows = list(rows)
        top_repeat = max(rows, key=lambda r: r[1][0])
        top_copy = max(rows, key=lambda r: r[1][1])
        print(f"{title} ({len(rows)}): longest repeat {top_repeat[1][0]} ({top_repeat[0]}), "
              f"longest copy {top_copy[1][1]} ({top_copy[0]})")
        for name, (rep, cop) in sorted(rows, key=lambda r: -max(r[1]))[:5]:
            print(f"    {name}: repeat {rep}, copy {cop}")
    if results:
        runs = sorted(echoed(results), key=lambda r: -r[1])
        print(f"eval right answers ({len(runs)}): longest run repeating an earlier answer to "
              f"another question {runs[0][1] if runs else 0} ({runs[0][0] if runs else '-'})")
        for name, run in runs[:5]:
            print(f"    {name}: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
