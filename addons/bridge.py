"""The tool bridge stage ("4 tools"): offers the tool server's tools to any agent and has the proxy run the
model's calls to them (issue 12, docs/bridge.md, ADR 0007).

With `bridge.families` empty (the default) it returns before parsing anything: requests pass byte for
byte. Otherwise, on a Responses create request it
1. makes the request valid upstream again (`proxy.items.bridged.repair_request`: ctproxy's `mcp_call`
   items back into calls + outputs, dropped ones spliced back, the merged response id mapped to the
   upstream's last one);
2. appends the bridged specs after the agent's own tools (`proxy.bridge.specs`), an agent tool of the
   same name winning;
3. re-routes the request to the bridge's loopback endpoint (`proxy.bridge.server`) under a one-time job
   that keeps, in memory, the real destination, the credential headers (taken off the request here, so
   nothing but the job holds them) with the one credential rule's verdict, and the caller's identity.
   The endpoint streams the merged answer back. Its first round is sent upstream through the
   upstream-turn service the moment the body writer has written the body (every later stage has run),
   not after the loopback hop, and the request to the endpoint goes without its body, which the flow gets
   back once the endpoint has the request (`BridgeService.launch`, ADR 0007 decision 6).
Loads alone: `mitmdump -s addons/bridge.py` (with `--set ctp_tools_url=…`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os

from mitmproxy import ctx, http

from addons._flow import credential_offer, destination_route, header_map, is_reverse, session_of
from addons._stage import Stage
from proxy import routes
from proxy.app import runtime
from proxy.bridge.server import PATH_PREFIX, SEEN_FILE, BridgeService
from proxy.bridge.specs import OTHER_SEARCH, append_specs, select
from proxy.bridge.turn import BridgeJob
from proxy.host.flowbody import ResponsesBody, commit_if_alone, is_responses_create, responses_body
from proxy.host.flowstate import ContextUsage, state_of
from proxy.items.bridged import repair_request
from proxy.toolclient import CallerUpstream, ToolClient
from proxy.transforms.web_search import SIDECAR_TOOL, search_path
from proxy.upstream import UpstreamTurns
from proxy.windows import budget, recovery

log = logging.getLogger("ctproxy.bridge")
_CREDENTIAL_NAMES = frozenset(n.encode() for n in routes.CREDENTIAL_HEADERS)
_BODY_HEADERS = frozenset({b"content-length", b"content-encoding", b"transfer-encoding"})


def base_url(url: str, kind: str | None) -> str:
    """The API root of a request URL: …/v1 or …/backend-api/codex."""
    for marker in ("/backend-api/codex/", "/v1/"):
        at = url.find(marker)
        if at >= 0:
            return url[: at + len(marker) - 1]
    return url.rsplit("/", 1)[0]


class Bridge(Stage):
    def load(self, loader) -> None:
        super().load(loader)
        if "ctp_tools_url" not in loader.master.options:  # also declared by codex_backend: one declaration
            loader.add_option("ctp_tools_url", str, "", "the tool server's URL (set by `ctproxy up`)")

    def _service(self, rt: runtime.Runtime) -> BridgeService | None:
        svc = rt.services.bridge
        if svc is None:
            try:
                url = str(getattr(ctx.options, "ctp_tools_url", "") or "")
            except AttributeError:  # no mitmproxy master (a unit test): nothing to call
                url = ""
            if not url:
                return None

            def turns() -> UpstreamTurns:
                if rt.services.upstream is None:
                    rt.services.upstream = UpstreamTurns()
                return rt.services.upstream

            svc = rt.services.bridge = BridgeService(ToolClient(url, rt.state.token()), turns,
                                                     seen_path=rt.state.root / SEEN_FILE)
        return svc

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        rt = self.rt
        cfg = rt.config.bridge
        if not cfg.families or not is_responses_create(flow):
            return  # bridge off: the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        svc = self._service(rt)
        if svc is None:
            return
        st = state_of(flow)
        task = agent = session = None
        ident = session_of(flow, rt.services.response_aliases)
        if ident is not None:
            task, agent, session = ident.task, ident.agent, ident.session_key
        body.replace(repair_request(body.value, svc.memory, session))
        specs = await svc.tool_specs()
        if isinstance(st.agent_identity, tuple) and len(st.agent_identity) == 2:
            task, agent = st.agent_identity  # as the journal resolved them
        carried = None
        if specs and rt.config.enabled("tool_discovery"):  # the session's loads decide what is carried
            carried = await svc.carried(specs, session, task, agent, rt.config.tool_discovery.deferred)
        route = st.route if isinstance(st.route, routes.Route) else destination_route(flow, rt.upstream.trusted)
        # one search path per turn: the sidecar tool only when this turn does not search natively
        withheld = None if search_path(rt.config.web_search, route.eligible) == "sidecar" else \
            {SIDECAR_TOOL: OTHER_SEARCH}
        offer = select(specs or [], cfg.families, body.value, cfg.apply_patch_form, carried=carried,
                       withheld=withheld)
        if offer.left_out:
            svc.note_left_out(offer.left_out)
        if not offer.tools:
            commit_if_alone(flow)
            return
        body.replace(append_specs(body.value, offer))
        st.bridge_offered = len(offer.tools)
        req = flow.request
        pairs = list(req.headers.items(multi=True))
        allowed = routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, route, is_reverse(flow),
                                                 pairs)
        if not allowed and routes.credential_mismatch(req.scheme, req.host, req.port, req.path, pairs) is not None:
            commit_if_alone(flow)
            return  # not bridged: the guard refuses it with its 403
        creds = tuple((k, v) for k, v in pairs if k.lower() in routes.CREDENTIAL_HEADERS)
        handed = header_map(flow)
        if (gateway := routes.gateway_key(route, is_reverse(flow), pairs, os.environ)) is not None:
            creds, allowed = (("authorization", f"Bearer {gateway}"),), True  # never the sign-in
            handed = {k: v for k, v in handed.items() if k not in routes.CREDENTIAL_HEADERS} | dict(creds)
        if allowed and creds:
            # The job takes the credentials off the request: the guard hands them over for this session.
            official = routes.is_official_destination(req.scheme, req.host, req.port, req.path) is not None
            st.credential_offer = credential_offer(flow, handed, official)
        url = req.url
        # Before the first call: the task and agent in the database, where the tool server reads them.
        registered = functools.partial(asyncio.to_thread, st.journal.flush, 10.0) if st.journal is not None else None
        job = BridgeJob(url=url, credentials=creds, credentials_allowed=allowed, offer=offer,
                        caller=CallerUpstream(base_url(url, route.kind), route.kind, route.official, allowed,
                                              dict(creds) if allowed else {}),
                        task=task, agent=agent, session=session, max_rounds=cfg.max_rounds,
                        timeout=rt.config.timeouts.stream_idle_seconds, registered=registered,
                        catalog=tuple(specs or ()),
                        families=tuple(cfg.families), apply_patch_form=cfg.apply_patch_form,
                        context_usage=ContextUsage(record=_usage_recorder(rt, session, task, agent)),
                        withheld=withheld, rollover=st.context_rollover,
                        overflow=recovery.midturn_recovery(rt, state_of(flow), flow.request.host))
        st.context_usage = job.context_usage  # the tap records the last round's usage for the context budget
        port = await svc.start()
        key, path = svc.register(job, req.path)
        if creds:  # the job holds them; the request to the loopback endpoint carries none
            req.headers.fields = tuple(f for f in req.headers.fields if f[0].lower() not in _CREDENTIAL_NAMES)
        req.scheme, req.host, req.port, req.path = "http", "127.0.0.1", port, path
        req.host_header = f"127.0.0.1:{port}"
        log.debug("bridge: offered %d tool(s), left out %d", len(offer.tools), len(offer.left_out))
        # The first round goes upstream the moment the request is final: when the body writer has written
        # the body (the last stage), with the body taken off the request to the endpoint; failing that, when
        # mitmproxy's request hook task ends (the request forwarded as it is).
        body = st.body
        if isinstance(body, ResponsesBody):
            body.on_commit = functools.partial(_launch, svc, job, key, flow, path, True)
        hook = asyncio.current_task()
        if hook is not None:
            hook.add_done_callback(lambda t: None if t.cancelled() else _launch(svc, job, key, flow, path, False))
        commit_if_alone(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        """The agent hung up (or the flow failed) before its request reached the endpoint: the launched
        round is closed (once claimed, the endpoint's handler is cancelled instead)."""
        svc = self._rt.services.bridge if self._rt is not None else None
        key = job_key(flow.request.path) if svc is not None else None
        if svc is not None and key is not None:
            svc.drop_launched(key)

    async def done(self) -> None:
        rt = self._rt
        if rt is not None and rt.services.bridge is not None:
            svc, rt.services.bridge = rt.services.bridge, None
            await svc.close()


def _usage_recorder(rt: runtime.Runtime, session: str | None, task: str | None, agent: str | None):
    """The bridged turn's per-round usage, recorded and committed before the round's budget calls run."""
    if session is None:
        return None

    async def record(used: dict, model: str | None, response_id: str | None) -> None:
        await budget.committed(budget.record(rt.services, rt.state.db_path, session, task, agent, model, used,
                                             response_id))

    return record


def job_key(path: str) -> str | None:
    """The job key of a path the stage re-routed (`/ctp-bridge/<key>/…`), else None."""
    if not path.startswith(PATH_PREFIX):
        return None
    key = path[len(PATH_PREFIX):].split("/", 1)[0]
    return key or None


def _launch(svc: BridgeService, job: BridgeJob, key: str, flow: http.HTTPFlow, path: str, take_body: bool) -> None:
    """Send the flow's first round upstream now (`BridgeService.launch`), unless a later stage answered it,
    it failed or it is no longer going to the endpoint (the endpoint then sends what it receives itself).
    `take_body`: mitmproxy has not sent the request yet, so it goes to the endpoint without its body (the
    round has it; the flow gets it back once the endpoint has the request)."""
    req = flow.request
    if not flow.live or flow.response is not None or flow.error is not None or flow.intercepted \
            or req.path != path or req.port != svc.port:
        return
    body = state_of(flow).body
    raw = req.raw_content
    if not isinstance(body, ResponsesBody) or body.changed or raw is None:
        return  # not the committed body: the endpoint decodes what it receives
    try:
        launched = svc.launch(key, req.headers.items(multi=True), raw, body.value)
    except Exception:  # the endpoint still sends the request itself
        log.exception("bridge: the first round could not be launched early")
        return
    if launched is None:
        return
    if not take_body or not raw:
        log.debug("bridge: round 1 sent upstream when the request hook ended (the body forwarded too)")
        return
    fields = req.headers.fields
    req.headers.fields = (*(f for f in fields if f[0].lower() not in _BODY_HEADERS), (b"content-length", b"0"))
    req.raw_content = b""
    job.body_taken = True

    def restore() -> None:
        req.raw_content = raw
        req.headers.fields = fields

    launched.take_body(restore)
    log.debug("bridge: round 1 sent upstream when the body was written; the request to the endpoint has none")


addons = [Bridge()]
