"""What helps a small model use tools, in one place: the aids the embedded model was tuned
with (``make eval``), all run by the session process as the turn builds each request.

- ``grammar``: the request's grammar (a call, text, or the choice between them);
- ``decision_word``: the word before a call or an answer, and what a question names;
- ``questions``: what a message asks (a file, the code, the project, nothing a tool knows);
- ``bare_json``: a call written as bare JSON taken as the call;
- ``step_rules``: what the next step of a turn may say, from the question, the tools and
  the workspace;
- ``last_listing``: the entry of the last listing that "the third one" names;
- ``workspace_words``: what a small workspace holds, read at a turn's first request;
- ``workspace_map``: the folder's names and sizes after a new session's system prompt.

The embedded model's system prompt and pinned tools are not here: they are the
``embedded.system`` and ``embedded.pinned`` settings (``actors/base/config.py`` and
``config/loopd.toml``), which a person reads and replaces like any other key.
"""
