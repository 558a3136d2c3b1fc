"""What a loopd process does before anything else: httpx's command-line tool left out.

httpx imports its command-line tool (click, pygments, rich's progress, syntax and tables)
whenever those are installed, and rich is a dependency of loopd: about 0.09 s of CPU in
every loopd process that speaks HTTP. loopd never runs that tool; marked absent here,
before anything imports httpx, httpx leaves it out (its ``httpx.main`` then says to install
httpx[cli]). A process that imported httpx first keeps it as it was.

The packages loopd's processes start from import this first (``actors.cli``: every
command, the daemon, ``loopd acp``; ``actors.tools.host``: a tool host). ``import actors``
does not: a program that uses loopd as a library keeps its httpx whole.
"""

import sys

sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
