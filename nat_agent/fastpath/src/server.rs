//! `ServiceLoop`: the metadata service's connections on threads of our own
//! (issue 13, parts 2 and 3: the connection loop out of CPython, every core).
//!
//! Why: with `FastLane` answering most requests, what the event loop still
//! spent per request was its own: a Python callback per read, a
//! `transport.write` per reply, and the system calls, all on one core. Here
//! each of N threads runs an epoll loop (mio) over its own `SO_REUSEPORT`
//! listener, so the kernel spreads connections over the threads, and the
//! system calls, parsing and hashing run without the GIL. A thread takes
//! the GIL only to call the lane (whose store calls are Python's) and to
//! hand a command over.
//!
//! The lane answers what it can of a connection's leading commands; the
//! first command it declines (and any parse error) is handed to the service
//! on the event loop (`handoff`, which schedules it there), and the
//! connection answers nothing more until the service's reply comes back
//! through `reply`, so replies stay in request order. The service words
//! every refusal and error, as on the event loop's path.
//!
//! The limits are `nat_agent.connection`'s, enforced here the same way:
//! unsent replies (`UNSENT_HIGH`/`UNSENT_LOW`), read-ahead while a command
//! waits (`READ_AHEAD`), a request's deadline from its first byte, the idle
//! timeout (checked every `sweep_interval`), and `max_clients` (the least
//! recently useful connection is reclaimed, a newcomer refused only when
//! every connection waits; see "Reclaiming across workers"). Each is handed over by the service, as is
//! every reply it words (`refusal`, `timeout_reply`, the reclaim's); and
//! what happens to a connection (opened, refused, reclaimed, overdue,
//! dropped mid-request) is reported to the service's callables, which count
//! and log it as for the event loop's connections. So no number, counter
//! name or wording of the Python path is restated here.
//!
//! Group commit (`--fsync batch`, issue 27): the SETs the lane answers in
//! one turn of a worker's loop are not written one by one (in any `--fsync`
//! mode when the store is the extension's own LevelDB): they are kept
//! in the turn (`lane::Turn`, which the turn's later reads consult) and
//! written as one LevelDB batch when the turn ends (`apply`), one log
//! `write` for all of them. Their replies, and those of reads of a key
//! whose last write is not yet synced, are held (`Held`: the bytes of `out`
//! from the first of them on; what follows them waits too, to keep the
//! order), and a command the lane declines is not handed over while
//! replies are held. Then (`settle`) the worker waits, with the GIL
//! released, for one sync that covers every reply it holds
//! (`durable::SyncGroup`, shared with the other workers and the event
//! loop), and sends them: Redis's `appendfsync always`, whose replies of an
//! event-loop round follow its fsync. If the sync fails, each held reply
//! that needed it becomes the service's error (`sync_failed`); if the store
//! refused the batch, each reply that showed it does (`write_failed`).
//!
//! Migration safety: a store call releases the GIL, so the event loop can
//! freeze a block while a worker's write to it is under way. A turn of a
//! worker's loop holds `gate` for reading from before its first lane call
//! (taken before the GIL, so it never waits on a holder of the GIL) until
//! its batch has landed, and `barrier` takes it for writing:
//! `InFlight.drain` calls it, so once a freeze has drained, every write
//! admitted before the freeze has landed, and every later one sees it.
//!
//! Reclaiming across workers: at `max_clients`, a connection that has sent
//! a complete command is never reclaimed while an idle or trickling one
//! exists in any worker. Two parts. (1) Before a connection is judged the
//! least recently useful, what it has sent is read and answered
//! (`catch_up`): a client whose command sits unread in its socket is served
//! (and so becomes the most recently useful), never reclaimed unread; and
//! a connection with an incomplete request (a trickler's half command)
//! goes before any without one, so that a storm of reconnecting tricklers
//! (each reconnection at the limit reclaims one, which reconnects in turn)
//! does not reclaim a client between its connect and its command. (2) A
//! worker owns its connections and no other thread touches them, so the
//! choice across workers goes through `Mailbox::stalest`: each worker
//! publishes the rank of its stalest reclaimable connection (lowered at once
//! when a connection is accepted or answered by the service, recomputed at
//! every scan and sweep and when its stalest closes, so it is never later
//! than the truth, only at times earlier). A worker at the limit compares
//! its own stalest with the others'; if another's is staler, it takes that
//! worker's published value (a compare-and-swap to none, so one claim at a
//! time per worker), admits the newcomer and posts the claim (`free_one`).
//! The owner, having read its candidates, reclaims its stalest if that is
//! still staler than the claimer's, passing the claim on first if yet
//! another worker published a staler one; if its own is not staler, it
//! publishes its true rank and hands the claim back (`Fallback`), and the
//! claimer makes room again. So the agent holds at most one connection over
//! `max_clients` per claim in flight, for a turn or two of the workers'
//! loops; the request path pays nothing (the ranks are read only at the
//! limit, and written on accept, on a close, on the service's replies and
//! at the limit).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::lane::{Acknowledgement, FastLane, Outcome, Turn, Waiting};
use crate::parser::CommandParser;

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// A reply the service sends back to a worker's connection.
struct Reply {
    conn: usize,
    data: Vec<u8>,
    close: bool,
    resp3: bool,
}

/// What a worker is sent (see "Reclaiming across workers").
enum Message {
    Reply(Reply),
    /// Worker `from` admitted a newcomer at the limit because this worker
    /// published a staler connection than its own stalest (of rank `bar`).
    Claim { from: usize, bar: u64 },
    /// A claim came back: the owner had nothing staler after all.
    Fallback,
}

/// A connection's rank for reclaiming: lower goes first. One already
/// closing goes first; then those with an incomplete request, then the
/// others (`SETTLED` on), each the one whose useful progress is oldest
/// first; one waiting on the service never (`NOTHING`).
const NOTHING: u64 = u64::MAX;
/// Where the ranks of connections without an incomplete request begin.
const SETTLED: u64 = 1 << 62;

/// A worker's inbox, its waker, and the rank of its stalest reclaimable
/// connection as it last published it.
struct Mailbox {
    inbox: Mutex<Vec<Message>>,
    waker: Waker,
    stalest: AtomicU64,
}

/// The limits, from `nat_agent.connection`, `client_lib.resp` and `ServiceLimits`.
#[derive(Clone)]
struct Limits {
    max_bulk: i64,
    max_args: i64,
    max_line: usize,
    unsent_high: usize,
    unsent_low: usize,
    flush_bytes: usize,
    read_ahead: usize,
    read_timeout: Duration,
    idle_timeout: Duration,
    sweep_interval: Duration,
    max_clients: usize,
}

/// What every worker shares.
struct Shared {
    lane: Py<FastLane>,
    /// Brings the lane's view in step with the ownership (the service's
    /// `lane`), called when the view is stale.
    refresh: PyObject,
    /// `(worker, conn, peer, resp3, command or exception)`: schedules the
    /// service's answer on the event loop.
    handoff: PyObject,
    arg_limit: PyObject,
    /// `(message, replies)`: the error reply for each of `replies` held
    /// replies whose sync failed, worded (and counted) by the service;
    /// `write_failed` the same for replies whose turn's writes could not be
    /// applied (`message`: the store's error).
    sync_failed: PyObject,
    write_failed: PyObject,
    /// The same for replies whose turn's writes were refused (not written:
    /// a block's role changed meanwhile, or a replicated write of a key was
    /// under way): TRYAGAIN.
    turn_refused: PyObject,
    /// `(message, id)`: the reply for a replicated SET the replica set did not
    /// acknowledge (or a read that showed it), as the Python path words it.
    unacknowledged: PyObject,
    /// The connection events, each counted and logged by the service as on
    /// its own path: `connected()` (returns the connection's number),
    /// `refused()`, `reclaimed(peer, idle seconds)`, `overdue(peer, age in
    /// seconds, bytes so far)`, `dropped(peer, bytes unread)`.
    connected: PyObject,
    refused: PyObject,
    reclaimed: PyObject,
    overdue: PyObject,
    dropped: PyObject,
    /// Pre-worded by the service: the refusal at `max_clients`, the reply
    /// to a request past its deadline, the reclaim reply's prefix
    /// (`-ERR connection reclaimed: `) and its reasons.
    refusal: Vec<u8>,
    timeout_reply: Vec<u8>,
    reclaimed_prefix: Vec<u8>,
    at_limit: String,
    shutting_down: String,
    limits: Limits,
    live: AtomicUsize,
    gate: RwLock<()>,
    stopping: AtomicBool,
    /// One per worker, by index.
    mailboxes: Vec<Mailbox>,
    /// The origin of the ranks.
    epoch: Instant,
}

impl Shared {
    /// The service's error reply for `replies` replies that failed for
    /// `message` (`sync_failed`, `write_failed` or `turn_refused`).
    fn word(&self, failed: &PyObject, message: String, replies: usize) -> Vec<u8> {
        let fallback = format!("-ERR {message}\r\n");
        self.worded(failed, (message, replies), fallback)
    }

    /// What `wording` answers for `args`; if it fails (reported), `fallback`.
    fn worded<A>(&self, wording: &PyObject, args: A, fallback: String) -> Vec<u8>
    where
        A: for<'py> IntoPyObject<'py, Target = PyTuple>,
    {
        Python::with_gil(|py| {
            let worded = wording.call1(py, args);
            worded.and_then(|reply| reply.extract::<Vec<u8>>(py)).unwrap_or_else(|err| {
                err.write_unraisable(py, None);
                fallback.into_bytes()
            })
        })
    }

    /// Bring the lane's view in step with the ownership, if it is behind.
    fn in_step(&self, py: Python<'_>) -> PyResult<()> {
        if self.lane.get().view().stale() {
            self.refresh.call0(py)?;
        }
        Ok(())
    }

    /// Report an event (see the fields); a failure to count or log it is
    /// not worth failing a connection over, so it is reported and dropped.
    fn report<'py, A>(&self, py: Python<'py>, event: &PyObject, args: A) -> Option<PyObject>
    where
        A: IntoPyObject<'py, Target = PyTuple>,
    {
        event.call1(py, args).map_err(|err| err.write_unraisable(py, None)).ok()
    }

    /// Hand `message` to `worker` and wake it (a worker that is gone is ignored).
    fn post(&self, worker: usize, message: Message) -> io::Result<()> {
        let Some(mailbox) = self.mailboxes.get(worker) else { return Ok(()) };
        mailbox.inbox.lock().expect("never poisoned").push(message);
        mailbox.waker.wake()
    }

    /// A connection's rank for reclaiming (see `NOTHING`).
    fn rank(&self, conn: &Conn) -> u64 {
        if conn.waiting {
            NOTHING
        } else if conn.closing.is_some() {
            0
        } else {
            self.rank_at(conn.useful, conn.parser.busy())
        }
    }

    /// The rank of a connection last useful at `useful`, not closing, with
    /// an `incomplete` request or none (see `SETTLED`).
    fn rank_at(&self, useful: Instant, incomplete: bool) -> u64 {
        let nanos = useful.saturating_duration_since(self.epoch).as_nanos();
        let rank = u64::try_from(nanos).map_or(SETTLED - 1, |n| n.saturating_add(1).min(SETTLED - 1));
        if incomplete { rank } else { SETTLED + rank }
    }
}

/// A peer as the event loop's transports name it: `(host, port)`.
fn peer_of(addr: &SocketAddr) -> (String, u16) {
    (addr.ip().to_string(), addr.port())
}

/// The service's port on N threads. `listeners` are listening sockets'
/// file descriptors (one per worker, `SO_REUSEPORT`), which it takes over.
#[pyclass(module = "nat_agent._fastpath", frozen)]
pub struct ServiceLoop {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[pymethods]
impl ServiceLoop {
    #[new]
    #[pyo3(signature = (*, listeners, lane, refresh, handoff, sync_failed, write_failed, turn_refused, unacknowledged, connected, refused, reclaimed, overdue, dropped,
                        arg_limit, max_bulk, max_args, max_line, unsent, flush_bytes, read_ahead, read_timeout,
                        idle_timeout, sweep_interval, max_clients, refusal, timeout_reply, reclaimed_prefix,
                        at_limit, shutting_down))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        listeners: Vec<i32>,
        lane: Py<FastLane>,
        refresh: PyObject,
        handoff: PyObject,
        sync_failed: PyObject,
        write_failed: PyObject,
        turn_refused: PyObject,
        unacknowledged: PyObject,
        connected: PyObject,
        refused: PyObject,
        reclaimed: PyObject,
        overdue: PyObject,
        dropped: PyObject,
        arg_limit: PyObject,
        max_bulk: i64,
        max_args: i64,
        max_line: usize,
        unsent: (usize, usize),
        flush_bytes: usize,
        read_ahead: usize,
        read_timeout: f64,
        idle_timeout: f64,
        sweep_interval: f64,
        max_clients: usize,
        refusal: Vec<u8>,
        timeout_reply: Vec<u8>,
        reclaimed_prefix: Vec<u8>,
        at_limit: String,
        shutting_down: String,
    ) -> PyResult<Self> {
        let mut mailboxes = Vec::new();
        let mut loops = Vec::new();
        for fd in listeners {
            // SAFETY: the caller hands the descriptor over (`socket.detach()`).
            let std_listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            std_listener.set_nonblocking(true)?;
            let mut listener = TcpListener::from_std(std_listener);
            let poll = Poll::new()?;
            poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
            let waker = Waker::new(poll.registry(), WAKER)?;
            mailboxes.push(Mailbox { inbox: Mutex::new(Vec::new()), waker, stalest: AtomicU64::new(NOTHING) });
            loops.push((poll, listener));
        }
        let shared = Arc::new(Shared {
            lane,
            refresh,
            handoff,
            sync_failed,
            write_failed,
            turn_refused,
            unacknowledged,
            arg_limit,
            connected,
            refused,
            reclaimed,
            overdue,
            dropped,
            refusal,
            timeout_reply,
            reclaimed_prefix,
            at_limit,
            shutting_down,
            limits: Limits {
                max_bulk,
                max_args,
                max_line,
                unsent_high: unsent.0,
                unsent_low: unsent.1,
                flush_bytes,
                read_ahead,
                read_timeout: Duration::from_secs_f64(read_timeout),
                idle_timeout: Duration::from_secs_f64(idle_timeout),
                sweep_interval: Duration::from_secs_f64(sweep_interval),
                max_clients,
            },
            live: AtomicUsize::new(0),
            gate: RwLock::new(()),
            stopping: AtomicBool::new(false),
            mailboxes,
            epoch: Instant::now(),
        });
        let mut threads = Vec::new();
        for (index, (poll, listener)) in loops.into_iter().enumerate() {
            let mut run = Run::new(index, poll, listener, Arc::clone(&shared));
            let thread = std::thread::Builder::new()
                .name(format!("metaflow-worker-{index}"))
                // A thread state of its own for the thread's life, the GIL
                // released: each `with_gil` then only takes the GIL, where it
                // would otherwise make and free a thread state every time.
                .spawn(move || Python::with_gil(|py| py.allow_threads(|| run.serve())))
                .map_err(|err| PyOSError::new_err(err.to_string()))?;
            threads.push(thread);
        }
        Ok(ServiceLoop { shared, threads: Mutex::new(threads) })
    }

    /// The service's reply to a command handed over by `worker` for `conn`:
    /// sent in order, then the connection goes on (or closes, if `close`).
    fn reply(&self, worker: usize, conn: usize, data: Vec<u8>, close: bool, resp3: bool) -> PyResult<()> {
        Ok(self.shared.post(worker, Message::Reply(Reply { conn, data, close, resp3 }))?)
    }

    /// Wait until no worker is inside a lane call that began before this
    /// one (see the module's docstring); the GIL is released meanwhile.
    fn barrier(&self, py: Python<'_>) {
        py.allow_threads(|| drop(self.shared.gate.write().expect("never poisoned")));
    }

    /// Connections open now, over every worker.
    #[getter]
    fn connections(&self) -> usize {
        self.shared.live.load(Ordering::Relaxed)
    }

    /// Stop accepting, close every connection (a busy one is told why),
    /// and join the threads. Safe to call twice.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        for mailbox in &self.shared.mailboxes {
            mailbox.waker.wake()?;
        }
        let threads = std::mem::take(&mut *self.threads.lock().expect("never poisoned"));
        py.allow_threads(|| {
            for thread in threads {
                let _ = thread.join();
            }
        });
        Ok(())
    }
}

/// Replies held for a sync: `out` from `start` on, of which `waiting` need
/// it (see "Group commit").
struct Held {
    start: usize,
    waiting: Vec<Waiting>,
}

impl Held {
    /// `out`'s first `sent` bytes are gone.
    fn shift(&mut self, sent: usize) {
        self.start -= sent;
        for reply in &mut self.waiting {
            reply.start -= sent;
            reply.end -= sent;
        }
    }

    /// Each reply that `error_of` gives an error for becomes that error.
    fn fail<'e>(self, out: &mut Vec<u8>, error_of: impl Fn(&Waiting) -> Option<Cow<'e, [u8]>>) {
        let mut rebuilt = Vec::with_capacity(out.len() - self.start);
        let mut cursor = self.start;
        for reply in &self.waiting {
            let Some(error) = error_of(reply) else { continue };
            rebuilt.extend_from_slice(&out[cursor..reply.start]);
            rebuilt.extend_from_slice(&error);
            cursor = reply.end;
        }
        rebuilt.extend_from_slice(&out[cursor..]);
        out.truncate(self.start);
        out.extend_from_slice(&rebuilt);
    }
}

/// One client connection of a worker.
struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    ident: u64,
    parser: CommandParser,
    out: Vec<u8>,
    sent: usize,
    resp3: bool,
    /// A command is with the service; nothing more is answered until it replies.
    waiting: bool,
    held: Option<Held>,
    /// The client reads none of its replies: no answering, no reading.
    paused: bool,
    /// The socket has bytes we have not read (we stopped short of `WouldBlock`).
    unread: bool,
    /// A readiness event said the peer closed its side or the socket failed:
    /// read on until end of file or `WouldBlock`, not only until a short read.
    read_to_end: bool,
    closing: Option<Instant>,
    /// Closing, its last reply sent and its write side shut (`linger`).
    half_closed: bool,
    useful: Instant,
    started: Instant,
}

impl Conn {
    fn unsent(&self) -> usize {
        self.out.len() - self.sent
    }
}

/// Why a connection's turn ended.
enum Next {
    Keep,
    Drop,
}

/// One worker thread's loop and connections.
struct Run {
    index: usize,
    poll: Poll,
    listener: TcpListener,
    shared: Arc<Shared>,
    conns: HashMap<usize, Conn>,
    /// Connections holding replies for a sync (`Held`).
    held: HashSet<usize>,
    /// This turn's writes, applied as one batch when it ends (`apply`).
    turn: Turn,
    /// The ticket of the writes applied since the last `settle`, and the
    /// batches the store failed, with why; the acknowledgements their
    /// replicated writes wait for, and the batches refused, with why.
    applied: u64,
    unapplied: HashMap<u64, String>,
    acks: Vec<(u64, Py<Acknowledgement>)>,
    refused: HashMap<u64, String>,
    next: usize,
    buf: Vec<u8>,
}

impl Run {
    fn new(index: usize, poll: Poll, listener: TcpListener, shared: Arc<Shared>) -> Self {
        Run {
            index,
            poll,
            listener,
            shared,
            conns: HashMap::new(),
            held: HashSet::new(),
            turn: Turn::default(),
            applied: 0,
            unapplied: HashMap::new(),
            acks: Vec::new(),
            refused: HashMap::new(),
            next: FIRST_CONN,
            buf: vec![0; 64 << 10],
        }
    }

    fn serve(&mut self) {
        let mut events = Events::with_capacity(256);
        let tick = self.shared.limits.sweep_interval;
        let mut swept = Instant::now();
        while !self.shared.stopping.load(Ordering::SeqCst) {
            // Replies still held (see `settle`): look for events, but do not wait.
            let wait = if self.held.is_empty() { tick } else { Duration::ZERO };
            if let Err(err) = self.poll.poll(&mut events, Some(wait)) {
                if err.kind() != ErrorKind::Interrupted {
                    break;
                }
            }
            // Every lane call runs inside the gate, and the turn's writes land
            // before it is let go (see "Migration safety").
            let shared = Arc::clone(&self.shared);
            let gate = shared.gate.read().expect("never poisoned");
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => self.messages(),
                    Token(id) => {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            if let Some(conn) = self.conns.get_mut(&id) {
                                conn.unread = true;
                                conn.read_to_end |= event.is_read_closed() || event.is_error();
                            }
                        }
                        self.turn(id);
                    }
                }
            }
            let now = Instant::now();
            if now.duration_since(swept) >= tick {
                swept = now;
                self.sweep(now);
            }
            self.apply();
            drop(gate);
            self.settle();
        }
        self.settle(); // what is held now is answered; what that lets in is not acknowledged
        self.shutdown();
    }

    fn accept(&mut self) {
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(err) if err.kind() == ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return, // e.g. EMFILE: the backlog keeps the client until we can
            };
            let _ = stream.set_nodelay(true);
            if self.shared.live.load(Ordering::Relaxed) >= self.shared.limits.max_clients && !self.make_room() {
                Python::with_gil(|py| self.shared.report(py, &self.shared.refused, ()));
                let _ = (&stream).write(&self.shared.refusal);
                continue;
            }
            let id = self.next;
            self.next += 1;
            let mut stream = stream;
            if self.poll.registry().register(&mut stream, Token(id), Interest::READABLE | Interest::WRITABLE).is_err() {
                continue;
            }
            let (ident, parser) = Python::with_gil(|py| {
                let ident: u64 = self
                    .shared
                    .report(py, &self.shared.connected, ())
                    .and_then(|ident| ident.extract(py).ok())
                    .unwrap_or(0);
                let limit = Some(self.shared.arg_limit.clone_ref(py));
                let limits = &self.shared.limits;
                (ident, CommandParser::new(py, limits.max_bulk, limits.max_args, limits.max_line, limit))
            });
            let now = Instant::now();
            self.shared.live.fetch_add(1, Ordering::Relaxed);
            self.lower(self.shared.rank_at(now, false));
            self.conns.insert(id, Conn {
                stream,
                peer,
                ident,
                parser,
                out: Vec::new(),
                sent: 0,
                resp3: false,
                waiting: false,
                held: None,
                paused: false,
                unread: true,
                read_to_end: false,
                closing: None,
                half_closed: false,
                useful: now,
                started: now,
            });
            self.turn(id);
        }
    }

    /// At `max_clients`: make room for a newcomer (see "Reclaiming across
    /// workers"): the stalest connection of the agent goes, this worker's
    /// own unless another worker published a staler one, which is then asked
    /// for it (`Claim`). False (the newcomer is refused) only when every
    /// connection waits.
    fn make_room(&mut self) -> bool {
        self.free_one(NOTHING, None)
    }

    /// Free one slot for a newcomer admitted by `claimer` (None: by this
    /// worker) whose own stalest connection has rank `bar`: reclaim ours
    /// unless another worker published a staler one (then it is asked in
    /// turn: a published rank is only a lower bound, so each worker asked
    /// looks at its own and passes the claim on while another's is
    /// staler); if ours is no staler than `bar`, the claim goes back
    /// (`Fallback`), and the claimer, its claim gone back, makes room again,
    /// now with that worker's true rank published. Whether a slot was freed
    /// or claimed.
    fn free_one(&mut self, bar: u64, claimer: Option<usize>) -> bool {
        let live = self.shared.live.load(Ordering::Relaxed);
        let own = self.stalest();
        let freed = if self.shared.live.load(Ordering::Relaxed) < live {
            true // a connection left while the candidates were read
        } else {
            match own {
                Some((id, rank)) if rank < bar => {
                    self.claim_elsewhere(rank) || {
                        self.reclaim_at_limit(id);
                        true
                    }
                }
                _ => {
                    if let Some(claimer) = claimer {
                        let _ = self.shared.post(claimer, Message::Fallback);
                    }
                    claimer.is_none() && self.claim_elsewhere(NOTHING)
                }
            }
        };
        self.publish();
        freed
    }

    /// This worker's stalest reclaimable connection and its rank, after
    /// reading what the candidates have sent (`catch_up`); None when every
    /// connection waits on the service (or there is none).
    fn stalest(&mut self) -> Option<(usize, u64)> {
        let mut caught = HashSet::new();
        loop {
            let (id, rank) = self.conns.iter().map(|(id, conn)| (*id, self.shared.rank(conn))).min_by_key(|c| c.1)?;
            if rank == NOTHING {
                return None;
            }
            if rank == 0 || !caught.insert(id) || !self.catch_up(id) {
                return Some((id, rank));
            }
        }
    }

    /// Read what a connection has sent and answer what of it is complete
    /// (`turn`), before it is judged idle: whether it made progress (a reply,
    /// a command handed over) or is gone.
    fn catch_up(&mut self, id: usize) -> bool {
        let Some(conn) = self.conns.get_mut(&id) else { return true };
        let before = conn.useful;
        conn.unread = true;
        self.turn(id);
        self.conns.get(&id).is_none_or(|conn| conn.waiting || conn.useful > before)
    }

    /// Ask the worker that published the stalest connection, if it is
    /// staler than `bar` (the rank of this worker's own stalest), for a
    /// slot (`free_one` there); whether a claim was posted.
    fn claim_elsewhere(&self, bar: u64) -> bool {
        let mailboxes = &self.shared.mailboxes;
        for _ in 0..mailboxes.len() {
            let others = mailboxes.iter().enumerate().filter(|(index, _)| *index != self.index);
            let Some((other, rank)) = others.map(|(i, m)| (i, m.stalest.load(Ordering::Acquire))).min_by_key(|o| o.1)
            else {
                return false;
            };
            if rank >= bar {
                return false;
            }
            // Taken, so that no other worker claims the same connection; its
            // owner publishes again once it has answered the claim.
            let taken = mailboxes[other].stalest.compare_exchange(rank, NOTHING, Ordering::AcqRel, Ordering::Acquire);
            if taken.is_ok() {
                return self.shared.post(other, Message::Claim { from: self.index, bar }).is_ok();
            }
        }
        false
    }

    /// Reclaim a connection for a newcomer at `max_clients`, reported as such.
    fn reclaim_at_limit(&mut self, id: usize) {
        let Some(conn) = self.conns.get(&id) else { return };
        let idle = conn.useful.elapsed().as_secs_f64();
        Python::with_gil(|py| self.shared.report(py, &self.shared.reclaimed, (peer_of(&conn.peer), idle)));
        let why = self.shared.at_limit.clone();
        self.reclaim(id, &why);
    }

    /// Publish the rank of this worker's stalest connection (a scan).
    fn publish(&self) {
        let stalest = self.conns.values().map(|conn| self.shared.rank(conn)).min().unwrap_or(NOTHING);
        self.shared.mailboxes[self.index].stalest.store(stalest, Ordering::Release);
    }

    /// A connection of ours became reclaimable at `rank`: keep the published
    /// rank no later than the truth.
    fn lower(&self, rank: u64) {
        self.shared.mailboxes[self.index].stalest.fetch_min(rank, Ordering::AcqRel);
    }

    /// `Connection.reclaim`: a busy connection is told why; an idle one is
    /// closed silently.
    fn reclaim(&mut self, id: usize, why: &str) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if conn.closing.is_none() && !conn.paused && conn.parser.busy() {
                conn.out.extend_from_slice(&self.shared.reclaimed_prefix);
                conn.out.extend_from_slice(why.as_bytes());
                conn.out.extend_from_slice(b"\r\n");
                let _ = flush(conn);
            }
        }
        self.forget(id);
    }

    fn forget(&mut self, id: usize) {
        if let Some(mut conn) = self.conns.remove(&id) {
            let _ = self.poll.registry().deregister(&mut conn.stream);
            let _ = conn.stream.shutdown(Shutdown::Both);
            self.shared.live.fetch_sub(1, Ordering::Relaxed);
            // The stalest one gone: publish the next, so that no worker is
            // sent a claim for a connection that is no more.
            let rank = self.shared.rank(&conn);
            let published = self.shared.mailboxes[self.index].stalest.load(Ordering::Relaxed);
            if self.conns.is_empty() || (rank != NOTHING && rank <= published) {
                self.publish();
            }
        }
    }

    fn messages(&mut self) {
        let inbox = &self.shared.mailboxes[self.index].inbox;
        let messages = std::mem::take(&mut *inbox.lock().expect("never poisoned"));
        for message in messages {
            match message {
                Message::Reply(reply) => self.reply(reply),
                Message::Claim { from, bar } => {
                    self.free_one(bar, Some(from));
                }
                // The worker asked had nothing staler than ours after all (its
                // published rank was low; it has now published its own):
                // make room again, as for a newcomer.
                Message::Fallback => {
                    self.make_room();
                }
            }
        }
    }

    fn reply(&mut self, reply: Reply) {
        let Some(conn) = self.conns.get_mut(&reply.conn) else { return }; // closed meanwhile
        conn.waiting = false;
        conn.resp3 = reply.resp3;
        conn.out.extend_from_slice(&reply.data);
        let now = Instant::now();
        conn.useful = now;
        conn.started = now;
        if reply.close && conn.closing.is_none() {
            conn.closing = Some(now);
        }
        let rank = self.shared.rank(conn);
        self.lower(rank);
        self.turn(reply.conn);
    }

    /// Everything a connection can do now: send, read, answer, in a loop
    /// until it would block, waits, is paused or is done.
    fn turn(&mut self, id: usize) {
        let Some(conn) = self.conns.get_mut(&id) else { return };
        let before = self.shared.rank(conn);
        let next = step(conn, self.index, id, &self.shared, &mut self.buf, &mut self.turn);
        if conn.held.is_some() {
            self.held.insert(id);
        }
        let after = self.shared.rank(conn);
        if after < before {
            self.lower(after); // it began an incomplete request: the published rank must not be later
        }
        if let Next::Drop = next {
            self.forget(id);
        }
    }

    /// Wait for the sync that covers every held reply, and for the replica
    /// set's acknowledgement of the batches they show, then send them (or,
    /// if one failed, the error for each reply it fails) and let those
    /// connections go on (see "Group commit"). What they answer then is
    /// held for the next turn's sync, so that a client that never stops
    /// sending cannot keep the worker from its other connections. The GIL
    /// is not held, nor the gate: the event loop, which the
    /// acknowledgements come from, may be waiting for the gate (`barrier`).
    fn settle(&mut self) {
        let shared = Arc::clone(&self.shared);
        let group = shared.lane.get().group();
        // Every reply that shows a batch applied so far is held now (or its
        // connection is gone), so the failed batches are settled here.
        let unapplied = std::mem::take(&mut self.unapplied);
        let refused = std::mem::take(&mut self.refused);
        let acks = std::mem::take(&mut self.acks);
        if self.held.is_empty() {
            return;
        }
        let ids: Vec<usize> = self.held.drain().collect();
        let held = || ids.iter().filter_map(|id| self.conns.get(id)?.held.as_ref()).flat_map(|h| &h.waiting);
        let ticket = held().map(|w| w.ticket).chain([std::mem::take(&mut self.applied)]).max().unwrap_or(0);
        let unsynced = group.and_then(|group| group.settle(ticket).err());
        let unacknowledged: HashMap<u64, String> =
            acks.into_iter().filter_map(|(batch, ack)| Some((batch, ack.get().wait(&shared.stopping)?))).collect();
        let word_batches = |failures: HashMap<u64, String>, failed: &PyObject| -> HashMap<u64, Vec<u8>> {
            failures
                .into_iter()
                .map(|(batch, message)| {
                    let replies = held().filter(|w| w.batch == Some(batch)).count();
                    (batch, shared.word(failed, message, replies))
                })
                .collect()
        };
        let mut failed = word_batches(refused, &shared.turn_refused);
        failed.extend(word_batches(unapplied, &shared.write_failed)); // the store's failure says more
        let failing = |reply: &Waiting| reply.batch.is_some_and(|batch| failed.contains_key(&batch));
        let unsynced = unsynced.map(|(_, message)| {
            let replies = held().filter(|w| !failing(w)).count();
            shared.word(&shared.sync_failed, message, replies)
        });
        // A replicated reply of a turn the set did not take: worded each, by its ID.
        let unacked = |reply: &Waiting| -> Option<Vec<u8>> {
            let (why, id) = (unacknowledged.get(&reply.batch?)?, reply.replicated?);
            let fallback = format!("-TRYAGAIN write not acknowledged by the replica set: {why}\r\n");
            Some(shared.worded(&shared.unacknowledged, (why.clone(), id), fallback))
        };
        let gate = shared.gate.read().expect("never poisoned");
        for id in ids {
            let Some(conn) = self.conns.get_mut(&id) else { continue };
            if let Some(held) = conn.held.take() {
                if !failed.is_empty() || !unacknowledged.is_empty() || unsynced.is_some() {
                    held.fail(&mut conn.out, |reply| match reply.batch.and_then(|batch| failed.get(&batch)) {
                        Some(error) => Some(Cow::Borrowed(error.as_slice())),
                        None => unacked(reply).map(Cow::Owned).or(unsynced.as_deref().map(Cow::Borrowed)),
                    });
                }
            }
            self.turn(id);
        }
        self.apply();
        drop(gate);
    }

    /// Apply the turn's writes as one batch (inside the gate); what the
    /// replies that show them wait for (`applied`, `acks`), or why they fail.
    fn apply(&mut self) {
        if !self.turn.has_writes() {
            return;
        }
        let (shared, turn) = (&self.shared, &mut self.turn);
        let lane = shared.lane.get();
        let batch = turn.number;
        let applied = Python::with_gil(|py| {
            // The view in step with the ownership, so that the batch is checked against it (`FastLane::apply`).
            if let Err(err) = shared.in_step(py) {
                err.write_unraisable(py, None);
            }
            lane.apply(py, turn).map_err(|err| err.value(py).to_string())
        });
        match applied {
            Ok((ticket, outcome)) => {
                self.applied = self.applied.max(ticket.unwrap_or(0));
                match outcome {
                    Some(Outcome::Pending(ack)) => self.acks.push((batch, ack)),
                    Some(Outcome::Refused(why)) => {
                        self.refused.insert(batch, why);
                    }
                    None => {}
                }
            }
            Err(message) => {
                self.unapplied.insert(batch, message);
            }
        }
    }

    /// `Connection.expire` for every connection; then the rank is published.
    fn sweep(&mut self, now: Instant) {
        let limits = self.shared.limits.clone();
        let mut overdue = Vec::new();
        let mut dropped = Vec::new();
        for (id, conn) in self.conns.iter_mut() {
            if let Some(since) = conn.closing {
                if now.duration_since(since) > limits.read_timeout {
                    dropped.push(*id); // its last replies were never read
                }
            } else if conn.waiting {
            } else if conn.paused {
                if now.duration_since(conn.useful) > limits.idle_timeout {
                    dropped.push(*id);
                }
            } else if conn.parser.busy() {
                if now.duration_since(conn.started) > limits.read_timeout {
                    overdue.push(*id);
                }
            } else if now.duration_since(conn.useful) > limits.idle_timeout {
                dropped.push(*id);
            }
        }
        for id in dropped {
            self.forget(id);
        }
        for id in overdue {
            if let Some(conn) = self.conns.get_mut(&id) {
                let age = now.duration_since(conn.started).as_secs_f64();
                let report = (peer_of(&conn.peer), age, conn.parser.pending());
                Python::with_gil(|py| self.shared.report(py, &self.shared.overdue, report));
                conn.out.extend_from_slice(&self.shared.timeout_reply);
                conn.closing = Some(now);
            }
            self.turn(id);
        }
        self.publish(); // the published rank is never later than the truth, but may lag: bring it in step
    }

    fn shutdown(&mut self) {
        let ids: Vec<usize> = self.conns.keys().copied().collect();
        let why = self.shared.shutting_down.clone();
        for id in ids {
            self.reclaim(id, &why);
        }
    }
}

/// Send what can be sent (nothing held); Err if the connection is broken.
fn flush(conn: &mut Conn) -> io::Result<()> {
    let end = conn.held.as_ref().map_or(conn.out.len(), |held| held.start);
    while conn.sent < end {
        match conn.stream.write(&conn.out[conn.sent..end]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => conn.sent += n,
            Err(err) if err.kind() == ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        }
    }
    if conn.sent == conn.out.len() {
        conn.out.clear();
        conn.sent = 0;
    } else if conn.sent > (64 << 10) {
        conn.out.drain(..conn.sent);
        if let Some(held) = &mut conn.held {
            held.shift(conn.sent);
        }
        conn.sent = 0;
    }
    Ok(())
}

fn step(conn: &mut Conn, worker: usize, id: usize, shared: &Shared, buf: &mut [u8], turn: &mut Turn) -> Next {
    let limits = &shared.limits;
    loop {
        if flush(conn).is_err() {
            return Next::Drop;
        }
        let now = Instant::now();
        if conn.paused && conn.unsent() <= limits.unsent_low {
            conn.paused = false;
            conn.useful = now;
        }
        if conn.closing.is_some() {
            return if conn.unsent() == 0 { linger(conn, buf) } else { Next::Keep };
        }
        if conn.unsent() >= limits.unsent_high {
            conn.paused = true;
        }
        if conn.paused {
            return Next::Keep;
        }
        // Answer what is buffered, as far as the lane goes or up to a handoff.
        if !conn.waiting && conn.parser.busy() {
            let before = conn.out.len();
            answer(conn, worker, id, shared, turn);
            if conn.out.len() > before {
                conn.useful = now;
                conn.started = now;
                continue; // send it, then go on
            }
        }
        // Read, unless a waiting command has enough read ahead of it.
        if !conn.unread || (conn.waiting && conn.parser.pending() > limits.read_ahead) {
            return Next::Keep;
        }
        match conn.stream.read(buf) {
            Ok(0) => {
                if conn.parser.busy() && conn.closing.is_none() {
                    let report = (peer_of(&conn.peer), conn.parser.pending());
                    Python::with_gil(|py| shared.report(py, &shared.dropped, report));
                }
                return Next::Drop;
            }
            Ok(n) => {
                if !conn.parser.busy() {
                    conn.started = now; // the first byte of a new request
                }
                conn.parser.feed(&buf[..n]);
                // A short read of a stream socket emptied it (epoll(7)): what
                // arrives after it raises a new edge, so the read that would
                // only say `WouldBlock` (one more system call per request) is
                // skipped. Not when the peer's close was seen: its end of file
                // raises no new edge.
                if n < buf.len() && !conn.read_to_end {
                    conn.unread = false;
                }
            }
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                conn.unread = false;
                if conn.waiting || !conn.parser.busy() {
                    return Next::Keep;
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Next::Drop,
        }
    }
}

/// After the last reply of a connection that is closing: half-close, then
/// drop what the client still sends until it closes. Closing with its bytes
/// unread would make the kernel send a reset, which can destroy that reply
/// before the client reads it (`Connection.close(linger=True)`, the event
/// loop's). The sweep ends a connection that lingers past the read timeout.
fn linger(conn: &mut Conn, buf: &mut [u8]) -> Next {
    if !conn.half_closed {
        if conn.stream.shutdown(Shutdown::Write).is_err() {
            return Next::Drop;
        }
        conn.half_closed = true;
    }
    loop {
        match conn.stream.read(buf) {
            Ok(0) => return Next::Drop,
            Ok(_) => {}
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                conn.unread = false;
                return Next::Keep;
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Next::Drop,
        }
    }
}

/// One lane call over the buffered commands, and the handoff of the first
/// one it declines. Holds the gate, then the GIL (in that order: see the
/// module's docstring).
fn answer(conn: &mut Conn, worker: usize, id: usize, shared: &Shared, turn: &mut Turn) {
    if conn.held.as_ref().is_some_and(|held| held.waiting.iter().any(|w| w.replicated.is_some())) {
        return; // the rest waits for the replica set's answer (see `FastLane::answer_into`)
    }
    Python::with_gil(|py| {
        let budget = shared.limits.flush_bytes;
        let lane = shared.lane.get();
        let hold = lane.in_turns().then_some(&mut *turn);
        let answered = shared
            .in_step(py)
            .and_then(|()| lane.answer_into(py, &mut conn.parser, conn.resp3, budget, &mut conn.out, hold));
        let waiting = std::mem::take(&mut turn.waiting);
        match (&mut conn.held, waiting.first()) {
            (Some(held), _) => held.waiting.extend(waiting),
            (None, Some(first)) => conn.held = Some(Held { start: first.start, waiting }),
            (None, None) => {}
        }
        match answered {
            Ok(0) => {}
            Ok(_) => return,
            Err(err) => err.write_unraisable(py, None), // the service's path answers it
        }
        if conn.held.is_some() {
            return; // handed over once the held replies are settled, to keep the order
        }
        let parsed: PyObject = match conn.parser.next_command(py) {
            Ok(None) => return,
            Ok(Some(command)) => command.into_any().unbind(),
            Err(err) => err.into_value(py).into_any(),
        };
        match shared.handoff.call1(py, (worker, id, peer_of(&conn.peer), conn.ident, conn.resp3, parsed)) {
            Ok(_) => conn.waiting = true,
            Err(err) => {
                // The event loop is gone (shutting down): nothing can answer.
                err.write_unraisable(py, None);
                conn.out.extend_from_slice(b"-ERR the service is shutting down\r\n");
                conn.closing = Some(Instant::now());
            }
        }
    });
}
