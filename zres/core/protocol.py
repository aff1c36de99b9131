"""Wire format shared by clients, the broker, agents and worker processes.

Every message is one ZeroMQ multipart message:

    [routing id]       added/removed by ROUTER sockets only
    header             msgpack array [VERSION, kind, body]; body is a map
    payload frames...  opaque bytes: cloudpickled functions, arguments and results

The broker only ever decodes the header (msgpack, which cannot execute code); payload
frames pass through it untouched, so it needs none of the users' libraries and a hostile
frame cannot run code in it. Batches put many items in one body; each item names how
many payload frames it owns (``nframes``) and the frames follow in item order.

Bodies, by kind (ids are ints; ``units`` maps resource name -> int in 1/10,000ths):

client -> broker
    hello      {client: name, epoch?: broker epoch last seen, versions?: {zres, python,
                cloudpickle}, output?: false, token?: task token}  versions: what the
                client runs (core/versions.py); the broker refuses a hello (refused{kind:
                hello}) whose versions differ from its own, naming both. output false:
                send this client none of its tasks' output. token: the client was made
                inside a task (its context, or $ZRES_TASK_TOKEN in a command job): while
                that task runs (that actor lives), the session acts for its owner with a
                client's powers, whatever key the connection has. With keys, a session is
                bound to the key that said hello with its routing id: that routing id's
                messages from any other key are refused
    (any)      {..., token?}                    a one-off request (a command's: jobs, logs,
                                                job_cancel, status) may carry a task token
                                                too, and acts for that task's owner
    resume     {ids: [id...]}                   after a broker restart: the tasks it still
                                                waits for (those that ended are told again,
                                                those not kept fail)
    submit     {tasks: [[id, units, priority, retries, deps: [id...], nframes, name, strict,
                         extra?]]}
               priority: -1000..1000 (else the submit is refused); a submit that would
               take its owner past its queued quota ([quotas.queued]) is refused, naming it
               extra, for actors: {actor: {id, name, cls, methods, restarts, concurrency,
               get_if_exists?, shared?}} makes the task an actor's construction (its
               result: the instance is up; shared: any key may call it, else only its
               owner's and admin keys; get_if_exists: a live actor of that name is kept and
               this one is not made (its construction fails, ValueError; lookup names the
               live one)); {call: actor id} makes it a method call (payload: method name,
               arguments), failed (NotOwnerError) if the actor is another owner's and not
               shared
               {job: {argv, env, export?, cwd, detached, nodes?}} makes it a command job (no
               payload); export: the variables taken from the submitter's environment
               (kept once per distinct map), env: its own, which win; a detached job
               outlives the client that submitted it; nodes: N > 1 runs it on N distinct
               agents at once (a multi-node job: see assign's job)
               {group: {id, name, bundles: [units...], strategy, restarts, detached}} makes
               it a placement group's construction (no payload; quiet): it ends, with no
               result, once every bundle is reserved (strategy PACK | SPREAD | STRICT_PACK |
               STRICT_SPREAD; restarts: reserved again whole after a lost bundle, -1 always)
               {placement: [group id, index]} places the task (or actor) in that bundle of
               one of its owner's groups: it draws on the bundle alone (refused, ValueError,
               if it asks more than the bundle, or the group is another's or has ended)
               {workers: [agent name...], allow_other_workers?: bool} (a Python task):
               it runs only on agents of those names (infeasible while none of them
               could), or, allow_other_workers, on one of them when one fits, else
               anywhere
               {quiet: true}: its client wants to hear it ended, not its result
               {detached: true}: it outlives its client (a job too): when its client
               goes it runs on (else it is stopped, as a forced cancel stops it)
               {retry_oom: true}: failed with MemoryLimitError, it spends a retry (if any)
    jobs       {all?: bool, unreported?: bool, jobs?: [job id...], ids?: [id...],
                reported?: [job id...], wait?: seconds}
                                                 -> jobs_reply {jobs: [...], ids?: [job id],
                                                 waited?: true}
               reported: a wait of the asker's has said how these of its own ended
               (unreported: the asker's own jobs its waits have not reported). wait (with
               jobs): the answer is held until none of them is queued or running, or for
               that many seconds (at most 30: ``zres wait`` asks so, then again); waited:
               it was held (absent: answered at once, as an older broker, or one holding
               too many waits, does: its asker looks again a little later). Each job
               names its owner; its argv, cwd, env, exported (a count) and error go only
               to its owner and admin keys; reason: why it waits, or why it ended (its
               error for those, words quoting nothing of it for others)
    job_cancel {job}                             only its owner or an admin key may: else
                                                 refused, naming the owner
    logs       {job, offset, rank?}              -> logs_reply {data, finished, state,
                                                 reason?, error?, nodes?, away?} (its owner
                                                 or an admin key only; error: none, as for a
                                                 job that ended without starting, saying why;
                                                 nodes: a multi-node job, whose log is each
                                                 rank's: ask with rank; away: true with an
                                                 error when the log's agent is not connected
                                                 now, as after a broker restart: a follower
                                                 asks again)
    group      {op: remove, id} | {op: lookup, name}  -> group_reply {req, state?, group?:
                                                 {id, name, bundles, strategy}, error?}: end
                                                 a placement group (its owner or an admin
                                                 key only), or find a live one by name
    task_cancel {task: id}                       stop a task by the broker's id, wherever
                                                 it is, as a forced cancel does (a one-off
                                                 request: zres cancel --task) ->
                                                 task_cancel_reply {error?, name?, state?:
                                                 stopping | cancelled}; only its owner or
                                                 an admin key may: else refused, naming
                                                 the owner
    kill       {actor: id}                       end an actor now -> kill_reply (its
                                                 owner or an admin key only)
    lookup     {name}                            -> lookup_reply {actor?: {id, cls, ...},
                                                 private?: {owner, cls}} (private: it
                                                 exists, is another's and not shared)
    release    {ids: [id...]}                    the client dropped these futures
    cancel     {ids: [id...], force?: bool, req?} those not begun never run; force: stop
                                                 the others too; with req -> cancel_reply
    status     {}                                -> status_reply
    why        {id}                              -> why_reply
    bye        {}                                the client closed: stop what it left
                                                 but what it detached (so is a client
                                                 whose connection closed and that is not
                                                 back within [broker] client_grace, or one
                                                 silent past client_timeout)
    resources  {agent: name, units}              change an agent's capacity at runtime
                                                 (names given are set, 0 removes one)
    place      {local, size, req}               put a value (scatter, zres.put, a call over
                                                1 MiB) on an agent: -> place_reply {req,
                                                id, token, at: [agent, address, key]} or
                                                {req, error, wait?} (over max_object_bytes,
                                                or, wait: no agent with a data port now, ask
                                                again later); the client then
                                                uploads it there (put, below) and the task
                                                LOCAL ends once that agent reports it whole
    locate     {ids: [id...], req}              where these results are now (a holder it
                                                fetched from is gone) -> locate_reply {req,
                                                refs: {id: ref}, lost: {id: why}, pending:
                                                [id...]} (pending: it runs again; lost:
                                                for good, or it ran again and failed)
broker -> client
    welcome    {epoch, cluster, keeps, heartbeat: seconds, new, resumed, limits:
                {header_bytes, payload_bytes, tasks}, relay?}  limits: what one submit
                                                may hold; keeps: it keeps its state (tasks
                                                survive its restarts); resumed: it restored
                                                this client's tasks from a previous life;
                                                relay: [endpoint, key] (see the relay below)
    accepted   {upto, ids: [[local id, id, count]...]}  the submitted tasks up to this
                                                local id are kept (a broker that keeps its
                                                state sends it once they are written, one
                                                that does not at once); ids: the broker's
                                                ids of the tasks submitted since the last
                                                one, as runs (COUNT local ids from LOCAL
                                                ID are COUNT ids from ID): what users see
    results    {results: [[id, outcome, nframes, info]]}  outcome: ok | raised | failed
               a result kept on an agent (over 64 KiB) comes with no frames and info.ref:
               [id, size, get token, [[agent, address, key]...], relay?] (its holders, the
               relay), info.size: the client fetches it from a holder when asked for it
    warn       {id, reason}                     the task cannot run anywhere right now
    running    {ids: [id...]}                   these tasks began on an agent
    status_reply {...}, why_reply {id, reason}, kill_reply {}, lookup_reply {actor?}
               status_reply's job_waits: how many jobs requests with wait it holds now
               status_reply's placement_groups: [{id, name, owner, state, strategy,
               restarts_left, starts, cause, reason?, bundles: [{units, agent}]}]
               status_reply's owners: [{owner, holds, grants, weight, usage, share, charge,
               waiting, quota, queued_quota}] in fair-share order (zres.scheduler.owners)
    job_cancel_reply {error?}
    cancel_reply {req, cancelled: [id...]}       those cancelled; the rest may have begun
    resources_reply {error?: text, slots?: [units...]}
    unknown    {}                               "I do not know you": say hello again
    output     {items: [[id, name, agent, stream, data]]}  lines its tasks printed, in order
                                                written (stream 1 stdout, 2 stderr; data:
                                                bytes, whole lines, UTF-8), always sent
                                                before the task's result
    refused    {kind?, error, req?, ids?}       a message over a limit, malformed, or not
                                                the key's to send: its request (req) or
                                                tasks (ids) fail, naming why. kind hello
                                                ends the session (also sent when the
                                                client's key is revoked: its file removed
                                                from the broker's keys directory)
agent -> broker
    register   {name, session, slots: [{units, gpus: [device id...], gpu_memory}], host,
                pid, t, resume?: true, epoch?, versions?, data?: {address, key, bound}, objects?}
               data: its data port (where others reach it, its key, the endpoint it bound:
               where the relay reaches it, zres.broker.relay); objects: [[id, size]...] held
               versions: as a client's hello's; a mismatch is refused (refused{kind:
               register}) and the agent exits with status 1. With keys, its name is the
               node's own key's (agent-NAME) if there is one, else the key's that first
               registered it (kept in the state store): another key is refused
               session: the agent's record at the broker, kept across pauses and
               reconnections; t: when it was sent (the agent's clock) anchors the lease;
               resume: a reconnection of a live session (answered welcome{resumed} or
               unknown{ended})
               a new session also offers jobs?: [[id, slot, [gpu position...], taken]]
               still running (command jobs and Python tasks), actors?: [[actor id,
               placement, slot, [gpu position...], [call ids in hand]]], ended?: [[id,
               outcome, nframes, info]] (frames follow) of late, returned?: [id...]
               held but never begun, and exits?: [{actor, placement, cause, running,
               error?}] (as a report's) of actor processes that ended meanwhile (their
               calls not begun run on the next instance): a restarted broker of the
               cluster adopts them, grants them again or stops them (kill_actor for an
               actor); carried?:
               the session whose work it offers (the agent stopped none of it): if the
               broker last knew this agent's name by that session, a grant to it that
               is not offered never arrived, and goes again with no retry spent
    report     {seq, session, held?: [id...], started?: [id...],
                results?: [[id, outcome, nframes, info]], exits?: [{actor, placement,
                cause, running: [call ids started], error?: MemoryLimitError, exceeded?:
                true if past its own limit (not the node's reserve)}],
                returned?: [id...]}
               numbered per session, taken in strictly in order (one after a gap is
               dropped: it comes again), acknowledged cumulatively by ``ack`` in the
               broker's messages, sent again after a resumption until acknowledged. held: handed
               to a worker process, so possibly started (reported before the hand-off,
               which waits for this report's ack; a direct grant's waits for nothing: the
               broker counted it held from its assign; its held goes with the agent's
               next report, its start or its result, and needs no ack);
               started: its body began; returned: granted here and never started, to be
               granted again. The broker reads a report in that order, all of it at once.
               A result's info.stored: SIZE says it stays in the agent's store (no frames);
               stored?: [[id, size]...]: copies it now holds (inputs fetched, uploads).
               master?: [[id, address, port]...]: rank 0 of a multi-node job listens there
               (the broker sends the other ranks with it)
    holding    {session, tasks: [id...], resumed} after a resumption (welcome{resumed: N}),
                                                once the reports are sent again: every
                                                grant the agent holds
    drain      {session}                        stopping: grant nothing more here
    bye        {session, seq}                   gone; what it did not report is lost. seq:
                                                its last report's: after its last report
                                                (which says held every direct grant it
                                                handed over), so if the broker took every
                                                one, a direct grant not said held never
                                                reached a worker there (granted again,
                                                uncharged)
    logs_reply {token, data, error?}            a job's log, for the broker to pass on
    output     {session, items: [[id, stream, data]]}  what tasks printed, as the worker
                                                sent it, passed on at once (so before the
                                                report of their results); never kept or
                                                sent again: lost with a lost connection
broker -> agent
    welcome    {epoch, cluster, session, agent, heartbeat, lease: seconds, starve: seconds,
                adopts: bool, resumed?, ack?, data_secret, relay?}  adopts: it keeps its
               state, so jobs run on through its restarts (same cluster); data_secret: what
               tokens for its data port are checked with (HMAC-SHA256, kept with its state);
               relay: as in a client's welcome
    assign     {ack?, tasks: [[id, slot, units, gpus, nframes, deps: [nframes...], opts?]]}
               opts {queued?, taken?, priority, seq, attempt, actor?, job?, token?}: queued
               grants start when room frees there; direct ones fit now, and a direct
               Python task's grant is counted held (possibly begun) from this assign,
               which goes only once the broker has kept that: its agent hands it to a
               worker at once, while its lease holds (no ack awaited); actor {actor: id,
               concurrency}: start a process of its own that constructs the actor and then
               serves its calls; job {argv, env, cwd}: a command job the agent runs (env:
               its exported variables, then its own, then ZRES_TASK_TOKEN, with keys; a
               multi-node job's rank also has job_id (its job's: ZRES_JOB_ID), rank, and
               master: true for rank 0, whose agent picks an address and free port, puts
               them in its MASTER_ADDR/MASTER_PORT and reports them: master);
               token: the task's (or actor's) token, put in its context for the clients
               made in it; refs?: {dep index: ref} inputs kept on agents (their count -1:
               the worker reads them in place, or fetches them into this agent's store;
               a ref with no holders: none is connected now, its task cannot read it);
               payload?: index: its call was put on an agent, and is that input
    free       {ids: [id...]}                   objects nobody holds any more: unlink them
    call       {calls: [[id, actor id, nframes, deps: [nframes...], extra?]]}  extra:
                                                {refs, payload}, as in assign
    kill_actor {ids: [actor id...]}
    logs       {token, job, offset, ended?}     read a job's log file (ended: its job's end,
                                                wall clock: did job_log_retention remove it)
    cancel     {ids: [id...], force?: bool}     force: stop them even if they started
    recall     {ids: [id...]}                   queued grants asked back (behind a task
                                                that turned out long): those not begun are
                                                returned (a report's), the rest run on
    resources  {slots: [units...]}              the new capacity, for re-registering
    heartbeat  {epoch, echo?: t, ack?}          the answer to each heartbeat of the agent's
                                                (once the broker's turn has kept what came
                                                with it); echo: its latest heartbeat's t
    ack        {ack}                            reports received up to this seq
    unknown    {ended?: why, session?, replaced?, refused?: why}
               ended: the session is over (lost): stop its work, register anew;
               refused: its key was revoked: stop (exit status 1)
any peer -> broker
    heartbeat  {t?, session?, side?: true,      side: from an agent's heartbeat thread (own
                store?, memory?}                socket, agent's key) while its loop's echoes
                                                are late: SESSION is alive; answered {epoch,
                                                echo: t, session}. store: {objects, memory,
                                                spilled, budget}; memory: {limits: "cgroup
               v2" | "cgroup v1" | "watcher" | "off", reserve, available (bytes; -1: unknown),
               low: bool, tasks: [[id, current, peak]...] (bytes; what runs in a process of
               its own)}

agent -> worker process (over ipc)
    run        {tasks: [[id, nframes, deps: [nframes...], context]], capacity?, starve?, via?,
                direct?: {address, key?: [server, public, secret]}}  direct: the broker,
               and the agent's key (once); context.token: the task's token (see assign);
               context.run numbers the start in the worker's start log; context.queued
               grants start when they fit (priority, seq, since, taken); context.create
               marks an actor's construction (actor processes only); context.cpus: cores;
               via?: [session, epoch] the grants run under (their results may go straight)
    cancel     {ids: [id...], force?: bool,     drop these queued grants unless started;
                error?: info}                   force: stop them where they run (an
                                                exception raised in the call's thread),
                                                failing them with ERROR (else cancelled)
worker process -> agent (ready on the socket the agent sends to; done and output on a
second one, routing id that one's + ".out", which the worker's threads send on in turn)
    done       {results: [[id, outcome, nframes, info]], started?: [id...], dropped?,
                replicas?: [[id, size]...]}     info.stored: as in report; replicas: inputs
                                                it fetched into its agent's store
    ready      {pid}
    output     {items: [[id, stream, data]]}    whole lines tasks wrote to sys.stdout (1)
                                                or sys.stderr (2), every 0.1 s while there
                                                are some and before the done carrying
                                                their results (see agent/output.py)

worker process -> broker (a socket of its own, the agent's key; see agent/direct.py)
    direct_done {session, epoch, results: [[id, outcome, nframes, info, attempt]], started}
               small results (ok, raised), sent besides the done: taken for the grant
               they name (the agent's session, the broker's epoch, the task's attempt),
               else dropped

anyone -> an agent's data port (a socket of its own, CURVE with the agent's key; nothing is
served without a token the broker made with the cluster's data secret)
    get        {id, token, offset, length, req}  -> chunk {req, id, offset, size, error?} +
                                                one frame (at most 4 MiB of the object's
                                                file; size: the whole file's; error missing:
                                                it does not hold it)
    put        {id, token, size, offset, req} + one frame  -> put_ack {req, id, offset,
                                                error?, done?} (done: it has it whole)
    local      {req}                            -> local_reply {req, socket?, pid, uid}:
                                                where a reader on the agent's host gets an
                                                object's file instead of its bytes (socket:
                                                a Linux abstract unix socket's name, without
                                                its leading NUL; none: the agent offers no
                                                such socket); a reader checks the socket's
                                                peer is process PID of user UID
anyone on an agent's host -> its local socket (SOCK_SEQPACKET, zres.agent.data.local)
    get        {id, token, req}                 -> chunk {req, id, size, error?} with the
                                                object's file descriptor (SCM_RIGHTS, read
                                                only) unless error: read in place, no byte
                                                through a socket (zres.core.local_reads)
client or agent -> the broker's relay (zres.broker.relay; a wildcard host: the broker's)
    get, put   as to a data port, plus {agent, from}: the holder, who asks; answered by the
               agent (passed on as it comes) or {error}; counted in status_reply's relay:
               {address, transfers, bytes, inflight, clients: [{owner, client, ...}]}

Outcomes: ``ok`` (payload: the pickled result), ``raised`` (payload: the pickled exception
and its traceback text), ``failed`` (no payload; info = {type, message} names a zres error
such as AgentLostError, raised in the client as that class; MemoryLimitError's adds limit
and peak). info.peak_memory: the bytes a task (or job) with a process of its own used.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from .errors import ProtocolError
from .limits import quote
from .wire import (
    VERSION,
    Frame,
    Message,
    buffer,
    check_units,
    encode,
    field,
    recv,
    send,
    send_now,
    split_frames,
    waiting,
)

__all__ = ["VERSION", "Frame", "Message", "buffer", "check_units", "decode", "encode",
           "field", "recv", "send", "send_now", "split_frames", "waiting"]

# Message kinds.
HELLO = "hello"
WELCOME = "welcome"
SUBMIT = "submit"
RELEASE = "release"
CANCEL, RECALL = "cancel", "recall"
STATUS, STATUS_REPLY = "status", "status_reply"
WHY, WHY_REPLY = "why", "why_reply"
RESULTS = "results"
WARN = "warn"
RUNNING = "running"
UNKNOWN = "unknown"
REGISTER = "register"
DONE = "done"
DIRECT_DONE = "direct_done"  # (a worker's straight to the broker: agent/direct.py)
REPORT = "report"
HOLDING = "holding"
DRAIN = "drain"
ACK = "ack"
REFUSED = "refused"
ASSIGN = "assign"
HEARTBEAT = "heartbeat"
RUN = "run"
READY = "ready"
BYE = "bye"
RESOURCES, RESOURCES_REPLY = "resources", "resources_reply"
KILL, KILL_REPLY = "kill", "kill_reply"
LOOKUP, LOOKUP_REPLY = "lookup", "lookup_reply"
CALL = "call"
KILL_ACTOR = "kill_actor"
ACTOR_EXIT = "actor_exit"
JOBS, JOBS_REPLY = "jobs", "jobs_reply"
JOB_CANCEL, JOB_CANCEL_REPLY = "job_cancel", "job_cancel_reply"
TASK_CANCEL, TASK_CANCEL_REPLY = "task_cancel", "task_cancel_reply"
CANCEL_REPLY = "cancel_reply"
LOGS, LOGS_REPLY = "logs", "logs_reply"
RESUME = "resume"
ACCEPTED = "accepted"
OUTPUT = "output"
# The data plane: an agent's data port (zres.core.transfer), objects freed, put, located.
GET = "get"
CHUNK = "chunk"
PUT, PUT_ACK = "put", "put_ack"
FREE = "free"
PLACE, PLACE_REPLY = "place", "place_reply"
LOCATE, LOCATE_REPLY = "locate", "locate_reply"
LOCAL, LOCAL_REPLY = "local", "local_reply"
# Gangs: placement groups (issue 31).
GROUP, GROUP_REPLY = "group", "group_reply"

KINDS = frozenset({HELLO, WELCOME, SUBMIT, RELEASE, CANCEL, STATUS, STATUS_REPLY, WHY,
                   WHY_REPLY, RESULTS, WARN, RUNNING, UNKNOWN, REGISTER, DONE, ASSIGN, HEARTBEAT,
                   RUN, READY, BYE, RESOURCES, RESOURCES_REPLY, KILL, KILL_REPLY, LOOKUP,
                   LOOKUP_REPLY, CALL, KILL_ACTOR, ACTOR_EXIT, JOBS, JOBS_REPLY, JOB_CANCEL,
                   JOB_CANCEL_REPLY, CANCEL_REPLY, LOGS, LOGS_REPLY, REPORT, HOLDING, DRAIN,
                   ACK, REFUSED, RESUME, ACCEPTED, OUTPUT, TASK_CANCEL, TASK_CANCEL_REPLY,
                   GET, CHUNK, PUT, PUT_ACK, FREE, PLACE, PLACE_REPLY, LOCATE, LOCATE_REPLY,
                   LOCAL, LOCAL_REPLY, GROUP, GROUP_REPLY, DIRECT_DONE, RECALL})

# Task outcomes.
OK = "ok"
RAISED = "raised"
FAILED = "failed"


def decode(frames: Sequence[Frame]) -> Message:
    """Decode a received message (without routing id); raise ProtocolError if malformed."""
    if not frames:
        raise ProtocolError("empty message")
    head = frames[0]
    raw = head.bytes if hasattr(head, "bytes") else head
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"header is not msgpack: {quote(str(exc), 100)}") from None
    if not isinstance(header, list) or len(header) != 3:
        raise ProtocolError("header is not [version, kind, body]")
    version, kind, body = header
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"protocol version {quote(version, 40)}, expected {VERSION}")
    if not isinstance(kind, str) or kind not in KINDS:
        raise ProtocolError(f"unknown message kind {quote(kind, 60)}")
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind}: body is not a map")
    return Message(kind, body, list(frames[1:]))
