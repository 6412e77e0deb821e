//! What a context evaluated: graphs (a deferred flush is one graph), graph breaks
//! (evaluations forced before the user asked for one: a data read, an export, an
//! EAGER or SYNC invocation consuming a deferred value, a metadata query only running
//! can answer), ops per graph, time per graph, invocations per mode and check flags.
//! One set of counters in the context feeds every number, so they agree.

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::error::Site;
use crate::exec::EvalMode;

/// Why deferred work was handed to the workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Flush {
    /// `ndx_context_evaluate`.
    Evaluate = 1,
    /// A wait on a future.
    Wait = 2,
    /// A poll of a future.
    Poll = 3,
    /// Reading a pending tensor's data (a break).
    DataRead = 4,
    /// Exporting a pending tensor through DLPack (a break).
    Export = 5,
    /// An EAGER or SYNC invocation consumed a deferred value (a break).
    Consumer = 6,
    /// Metadata only running could tell (a host operator's output shape; a break).
    Metadata = 7,
}

impl Flush {
    /// Whether this flush is a graph break: forced before the user asked for results.
    pub fn is_break(self) -> bool {
        matches!(
            self,
            Flush::DataRead | Flush::Export | Flush::Consumer | Flush::Metadata
        )
    }
    /// A name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Flush::Evaluate => "evaluate",
            Flush::Wait => "wait",
            Flush::Poll => "poll",
            Flush::DataRead => "data_read",
            Flush::Export => "export",
            Flush::Consumer => "consumer",
            Flush::Metadata => "metadata",
        }
    }
}

/// Graph records kept in detail; later graphs are only counted.
pub const MAX_RECORDS: usize = 4096;

/// One evaluated graph.
#[derive(Debug, Clone)]
pub struct Graph {
    /// Why it was flushed.
    pub reason: Flush,
    /// Deferred invocations it ran.
    pub ops: u64,
    /// Submission to the completion of its last invocation (None: still running).
    pub time_ns: Option<u64>,
    /// The first deferred invocation it ran: the one whose value was needed (for
    /// `evaluate`, the earliest recorded one).
    pub seq: u64,
    start: Instant,
    /// Invocations not complete yet, plus one while the submitter is still adding.
    remaining: u64,
}

/// One graph break.
#[derive(Debug, Clone)]
pub struct Break {
    /// Index of the graph it flushed.
    pub graph: usize,
    /// Why.
    pub reason: Flush,
    /// The invocation whose value was needed.
    pub seq: u64,
    /// The site that forced it.
    pub site: Arc<Site>,
}

/// A context's counters.
#[derive(Debug, Default)]
pub struct Stats {
    graphs: Vec<Graph>,
    graphs_total: u64,
    breaks: Vec<Break>,
    breaks_total: u64,
    graph_ops_total: u64,
    by_mode: [u64; 4],
}

/// Why a flush happened and who forced it (the site is captured only for breaks).
pub struct Why {
    /// The reason.
    pub reason: Flush,
    /// The forcing site when known (a consuming invocation's site).
    pub site: Option<Arc<Site>>,
}

impl Why {
    /// A reason with no known site.
    pub fn new(reason: Flush) -> Why {
        Why { reason, site: None }
    }
}

impl Stats {
    /// Counts an enqueued invocation.
    pub fn invoked(&mut self, mode: EvalMode) {
        self.by_mode[mode as usize - 1] += 1;
    }

    /// Opens a graph for a flush; `None` once the records are full (still counted).
    pub fn open(&mut self, why: &Why, seq: u64) -> Option<usize> {
        self.graphs_total += 1;
        let id = (self.graphs.len() < MAX_RECORDS).then_some(self.graphs.len());
        if why.reason.is_break() {
            self.breaks_total += 1;
            if let (Some(graph), true) = (id, self.breaks.len() < MAX_RECORDS) {
                // The forcing call's own frame (symbolised only when read).
                let site = why
                    .site
                    .clone()
                    .unwrap_or_else(|| Arc::new(Site::capture_native(1)));
                self.breaks.push(Break {
                    graph,
                    reason: why.reason,
                    seq,
                    site,
                });
            }
        }
        if id.is_some() {
            self.graphs.push(Graph {
                reason: why.reason,
                ops: 0,
                time_ns: None,
                seq,
                start: Instant::now(),
                remaining: 1,
            });
        }
        id
    }

    /// Adds an invocation to graph `id` (`None`: a graph past the records).
    pub fn add(&mut self, id: Option<usize>) {
        self.graph_ops_total += 1;
        if let Some(g) = id.and_then(|id| self.graphs.get_mut(id)) {
            g.ops += 1;
            g.remaining += 1;
        }
    }

    /// One invocation of graph `id` (or the submitter's hold) is done.
    pub fn done(&mut self, id: usize) {
        let Some(g) = self.graphs.get_mut(id) else {
            return;
        };
        if g.remaining == 0 {
            return; // never below zero
        }
        g.remaining -= 1;
        if g.remaining == 0 {
            g.time_ns = Some(g.start.elapsed().as_nanos() as u64);
        }
    }

    /// A snapshot for `ndx_context_explain`.
    pub fn snapshot(&self, checks_raised: u64) -> Explain {
        Explain {
            graphs: self.graphs.clone(),
            graphs_total: self.graphs_total,
            breaks: self.breaks.clone(),
            breaks_total: self.breaks_total,
            graph_ops: self.graph_ops_total,
            by_mode: self.by_mode,
            checks_raised,
        }
    }
}

/// What `ndx_context_explain` returns: the counters at one moment.
#[derive(Debug, Clone)]
pub struct Explain {
    /// Graph records (the first [`MAX_RECORDS`]).
    pub graphs: Vec<Graph>,
    /// Graphs evaluated.
    pub graphs_total: u64,
    /// Break records (the first [`MAX_RECORDS`]).
    pub breaks: Vec<Break>,
    /// Graph breaks.
    pub breaks_total: u64,
    /// Deferred invocations run by all graphs.
    pub graph_ops: u64,
    /// Invocations per eval mode (SYNC_CPU, SYNC_FULL, DEFERRED, EAGER).
    pub by_mode: [u64; 4],
    /// Check flags raised.
    pub checks_raised: u64,
}

impl Explain {
    /// Invocations enqueued.
    pub fn ops(&self) -> u64 {
        self.by_mode.iter().sum()
    }

    /// The report as JSON text.
    pub fn json(&self) -> String {
        let graphs: Vec<_> = self
            .graphs
            .iter()
            .map(|g| {
                json!({
                    "reason": g.reason.name(),
                    "ops": g.ops,
                    "time_ns": g.time_ns.map_or(-1, |t| t as i64),
                    "seq": g.seq,
                })
            })
            .collect();
        let breaks: Vec<_> = self
            .breaks
            .iter()
            .map(|b| {
                let f = b.site.frames().first();
                json!({
                    "graph": b.graph,
                    "reason": b.reason.name(),
                    "seq": b.seq,
                    "file": f.and_then(|f| f.file()),
                    "line": f.map(|f| f.line()),
                    "function": f.and_then(|f| f.function()),
                })
            })
            .collect();
        let m = &self.by_mode;
        let doc = json!({
            "ndx_explain": 1,
            "graphs_total": self.graphs_total,
            "breaks_total": self.breaks_total,
            "ops": self.ops(),
            "graph_ops": self.graph_ops,
            "invocations": {
                "sync_cpu": m[0], "sync_full": m[1], "deferred": m[2], "eager": m[3],
            },
            "checks_raised": self.checks_raised,
            "graphs": graphs,
            "breaks": breaks,
        });
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }
}
