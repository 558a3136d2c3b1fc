"""How loopd authenticates to an MCP server over HTTP, and answers its elicitations.

:class:`McpAuth` is what a ``[[tools.hosts]]`` entry says, as references, never secrets: a
value ``"env:NAME"`` is read from the environment, ``"file:PATH"`` from a file, and anything
else is taken as written. The tool host gets it as JSON in ``LOOPD_MCP_AUTH`` (its
environment, which only its user can read, not its command line, which anyone can), and
resolves it itself; no secret is written to the log or reaches the model.

- ``headers`` and ``bearer``: static headers, and ``Authorization: Bearer TOKEN``;
- ``oauth = "authorization_code"``: OAuth 2.1 through the official SDK's client
  (``mcp.client.auth.OAuthClientProvider``: protected-resource and authorization-server
  metadata discovery, PKCE, the ``resource`` parameter, scope selection and step-up, dynamic
  or pre-registered clients, CIMD). The person is sent to the authorization URL (logged, and
  handed to ``on_authorize``); the browser comes back to a loopback listener here. Tokens
  are kept in ``token_file`` (mode 0600, in loopd's private place, hidden from the sandbox);
- ``oauth = "client_credentials"``: a machine client with ``client_id`` and ``client_secret``,
  or a ``private_key`` that signs its assertion (``private_key_jwt``).

:func:`elicitation_answer` is ``tools.elicitation``: ``"defaults"`` accepts a form with the
defaults its schema gives, ``"decline"`` and ``"ask"`` (when nobody can be asked, as in a
tool host) decline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
import mcp_types
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from actors.base.errors import McpError
from actors.tools.providers.mcp_settings import ElicitationMode, McpAuth, resolve

__all__ = ["Authorizer", "TokenFile", "elicitation_answer", "http_auth", "schema_defaults"]

log = logging.getLogger("loopd.mcp")

_CALLBACK_PATH = "/callback"
_PAGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"loopd has the authorization; you can close this page.\n"
)


class TokenFile:
    """The SDK's TokenStorage in one JSON file, written 0600 (its directory 0700)."""

    def __init__(self, path: str) -> None:
        self._path = Path(path).expanduser() if path else None
        self._data: dict[str, Any] = {}
        if self._path is not None and self._path.exists():
            with contextlib.suppress(OSError, ValueError):
                loaded = json.loads(self._path.read_text(encoding="utf-8"))
                self._data = loaded if isinstance(loaded, dict) else {}

    def _save(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self._path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self._data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self._path)

    async def get_tokens(self) -> OAuthToken | None:
        raw = self._data.get("tokens")
        return OAuthToken.model_validate(raw) if raw else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._data["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        self._save()

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        raw = self._data.get("client")
        return OAuthClientInformationFull.model_validate(raw) if raw else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._data["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self._save()


class Authorizer:
    """The authorization-code flow's two ends: the URL given to the person, and the
    loopback listener the browser is sent back to (bound when the flow starts)."""

    def __init__(
        self, label: str, port: int, timeout_s: float, on_authorize: Callable[[str], None]
    ) -> None:
        self.label = label
        self._port = port
        self._timeout_s = timeout_s
        self._on_authorize = on_authorize
        self._server: asyncio.Server | None = None
        self._answer: asyncio.Future[AuthorizationCodeResult] | None = None

    async def start(self) -> str:
        """Listen on loopback; the redirect URI to register."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)
            self._port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self._port}{_CALLBACK_PATH}"

    async def redirect(self, url: str) -> None:
        """Send the person to ``url`` (the SDK calls this; the code comes to the listener)."""
        self._answer = asyncio.get_running_loop().create_future()
        log.warning("MCP server %s needs authorization: open %s", self.label, url)
        self._on_authorize(url)

    async def callback(self) -> AuthorizationCodeResult:
        if self._answer is None:
            raise McpError(f"MCP server {self.label}: no authorization was asked for")
        try:
            return await asyncio.wait_for(self._answer, self._timeout_s)
        except TimeoutError:
            raise McpError(
                f"MCP server {self.label}: nobody authorized loopd within "
                f"{self._timeout_s:g} s (oauth_timeout_s in [[tools.hosts]])"
            ) from None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            parts = line.decode("latin-1").split()
            target = urlsplit(parts[1]) if len(parts) >= 2 else None
            query = parse_qs(target.query) if target is not None else {}
            code = query.get("code", [""])[0]
            if target is not None and target.path == _CALLBACK_PATH and code:
                if self._answer is not None and not self._answer.done():
                    self._answer.set_result(AuthorizationCodeResult(
                        code=code, state=query.get("state", [None])[0],
                        iss=query.get("iss", [None])[0],
                    ))
                writer.write(_PAGE)
            else:
                error = query.get("error", [""])[0]
                if error and self._answer is not None and not self._answer.done():
                    self._answer.set_exception(McpError(
                        f"MCP server {self.label}: the authorization was refused ({error})"
                    ))
                writer.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (OSError, TimeoutError, UnicodeError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


async def http_auth(
    auth: McpAuth, url: str, label: str, on_authorize: Callable[[str], None],
) -> tuple[httpx2.Auth | None, Authorizer | None]:
    """The httpx2 auth for ``auth.oauth`` (None without OAuth), and its listener."""
    if not auth.oauth:
        return None, None
    storage = TokenFile(auth.token_file)
    scope = " ".join(auth.scopes) or None
    secret = resolve(auth.client_secret, f"MCP server {label}: oauth_client_secret") \
        if auth.client_secret else ""
    if auth.oauth == "client_credentials":
        if not auth.client_id or not (secret or auth.private_key):
            raise McpError(
                f'MCP server {label}: oauth = "client_credentials" needs oauth_client_id and '
                "oauth_client_secret (or oauth_private_key) in [[tools.hosts]]"
            )
        if auth.private_key:
            key = resolve(auth.private_key, f"MCP server {label}: oauth_private_key")
            jwt = SignedJWTParameters(issuer=auth.client_id, subject=auth.client_id,
                                      signing_algorithm=auth.signing_algorithm, signing_key=key)
            return PrivateKeyJWTOAuthProvider(
                server_url=url, storage=storage, client_id=auth.client_id,
                assertion_provider=jwt.create_assertion_provider(), scope=scope,
            ), None
        return ClientCredentialsOAuthProvider(
            server_url=url, storage=storage, client_id=auth.client_id, client_secret=secret,
            scope=scope,
        ), None
    authorizer = Authorizer(label, auth.redirect_port, auth.authorize_timeout_s, on_authorize)
    redirect_uri = await authorizer.start()
    if auth.client_id and await storage.get_client_info() is None:
        await storage.set_client_info(OAuthClientInformationFull(
            client_id=auth.client_id, client_secret=secret or None,
            redirect_uris=[AnyUrl(redirect_uri)],
            token_endpoint_auth_method="client_secret_basic" if secret else "none",
        ))
    provider = OAuthClientProvider(
        server_url=url,
        client_metadata=OAuthClientMetadata(
            client_name="loopd", redirect_uris=[AnyUrl(redirect_uri)], scope=scope,
            grant_types=["authorization_code", "refresh_token"], response_types=["code"],
        ),
        storage=storage,
        redirect_handler=authorizer.redirect,
        callback_handler=authorizer.callback,
        client_metadata_url=auth.client_metadata_url or None,
    )
    return provider, authorizer


def schema_defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The defaults a form's schema gives its fields (SEP-1034)."""
    props = schema.get("properties")
    if not isinstance(props, Mapping):
        return {}
    return {
        name: prop["default"]
        for name, prop in props.items()
        if isinstance(prop, Mapping) and "default" in prop
    }


def elicitation_answer(
    mode: ElicitationMode, params: mcp_types.ElicitRequestParams, label: str,
) -> mcp_types.ElicitResult:
    """What ``tools.elicitation`` answers when nobody is asked."""
    message = getattr(params, "message", "")
    if mode == "defaults" and isinstance(params, mcp_types.ElicitRequestFormParams):
        content = schema_defaults(params.requested_schema)
        log.info("MCP server %s asked %r: accepted with its defaults %s", label, message,
                 sorted(content))
        return mcp_types.ElicitResult(action="accept", content=content)
    log.info("MCP server %s asked %r: declined (tools.elicitation = %r)", label, message, mode)
    return mcp_types.ElicitResult(action="decline")
