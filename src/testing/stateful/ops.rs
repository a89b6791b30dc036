//! The operations of the `stateful` fuzz target, and how they are decoded from fuzz bytes: the first
//! byte chooses the durability and compression, then each operation is an opcode byte and its
//! arguments, drawn from the model's vocabulary (`fuzz/make_seeds.py` has an encoder).

use crate::testing::model::{
    ItemSpec, QuerySpec, Ref, CONFIDENCES, IDS, KINDS, MIN_CONFIDENCES, PATHS, PIN_NAMES, QUERY_KINDS, SOURCES, START,
    VERSIONS, VIEWS,
};
use crate::Durability;

/// Operations read from one input at most; the rest of the bytes are ignored.
pub const OPS_MAX: usize = 24;

fn pick<T: Copy>(from: &[T], byte: u8) -> T {
    match from.get(usize::from(byte) % from.len().max(1)) {
        Some(value) => *value,
        None => panic!("an empty alphabet"),
    }
}

/// The input, read a byte at a time; past its end every byte reads as 0.
struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let byte = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        byte
    }

    fn is_empty(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn seed(&mut self) -> u64 {
        u64::from(self.byte()) | u64::from(self.byte()) << 8
    }

    fn read_view(&mut self) -> Option<&'static str> {
        match self.byte() % 5 {
            0..=1 => None,
            n => Some(pick(&VIEWS, n - 2)),
        }
    }

    fn write_view(&mut self) -> Option<&'static str> {
        match self.byte() % 6 {
            0..=3 => None,
            4 => Some("s1"),
            _ => Some("s2"),
        }
    }

    fn item(&mut self) -> ItemSpec {
        let identity = self.byte();
        let labels = self.byte();
        let extras = self.byte();
        let time = self.byte();
        let content = match (identity / 18) % 14 {
            n @ 8.. => Some(usize::from(n - 8)),
            _ => None,
        };
        ItemSpec {
            id: pick(&IDS, identity),
            version: pick(&VERSIONS, identity / 6),
            content,
            kind: pick(&KINDS, labels),
            source: pick(&SOURCES, labels / 3),
            scope: usize::from((labels / 6) % 4),
            ttl: (extras & 0x80 != 0).then_some(1 + u64::from(extras % 12)),
            confidence: match (extras >> 4) & 7 {
                n @ 0..=3 => Some(pick(&CONFIDENCES, n)),
                _ => None,
            },
            timestamp: START - 6 + i64::from(time % 15),
        }
    }

    fn query(&mut self) -> QuerySpec {
        let flags = self.byte();
        let mut query = QuerySpec::everything();
        if flags & 1 != 0 {
            // At least one type (see `QuerySpec::types`).
            let mask = self.byte() % 15 + 1;
            query.types = Some(subset(&QUERY_KINDS, mask));
        }
        if flags & 2 != 0 {
            let b = self.byte();
            let start = START - 7 + i64::from(b % 17);
            query.range = Some((start, start + i64::from((b / 17) % 8)));
        }
        if flags & 4 != 0 {
            let mask = self.byte() % 16;
            query.scopes = Some((0..4).filter(|s| mask & (1 << s) != 0).collect());
        }
        if flags & 8 != 0 {
            query.min_confidence = Some(pick(&MIN_CONFIDENCES, self.byte()));
        }
        if flags & 16 != 0 {
            let mask = self.byte() % 4;
            query.sources = Some(subset(&SOURCES, mask));
        }
        if flags & 32 != 0 {
            let b = self.byte();
            query.content_eq = Some((pick(&PATHS, b), usize::from((b / 2) % 4)));
        }
        query.newest_first = flags & 64 != 0;
        if flags & 128 != 0 {
            query.limit = Some(usize::from(self.byte() % 5));
        }
        query
    }

    fn refs(&mut self) -> Vec<Ref> {
        let count = 1 + self.byte() % 4;
        (0..count)
            .map(|_| {
                let b = self.byte();
                let version = match (b / 6) % 4 {
                    0 => None,
                    n => Some(pick(&VERSIONS, n - 1)),
                };
                (pick(&IDS, b), version)
            })
            .collect()
    }

    fn op(&mut self) -> Op {
        match self.byte() % 20 {
            0..=3 => {
                let view = self.write_view();
                let count = 1 + self.byte() % 3;
                let items = (0..count).map(|_| self.item()).collect();
                Op::Add { view, items }
            }
            4 => Op::Delete(pick(&IDS, self.byte())),
            5 => Op::Get {
                view: self.read_view(),
                query: self.query(),
            },
            6 => Op::Resolve {
                view: self.read_view(),
                refs: self.refs(),
            },
            18 => Op::PastAt {
                pick: self.byte(),
                query: self.query(),
                refs: self.refs(),
            },
            19 => Op::PastAsOf {
                pick: self.byte(),
                query: self.query(),
                refs: self.refs(),
            },
            7 => Op::Snapshot { view: self.read_view() },
            8 => Op::ReadSnap {
                snap: usize::from(self.byte()),
                query: self.query(),
                refs: self.refs(),
            },
            9 => Op::Advance(i64::from(self.byte() % 7)),
            10 => Op::Compact,
            11 => Op::Pin {
                name: pick(&PIN_NAMES, self.byte()),
                view: self.read_view(),
            },
            12 => Op::Unpin(pick(&PIN_NAMES, self.byte())),
            13 => Op::OpenPinned {
                name: pick(&PIN_NAMES, self.byte()),
                query: self.query(),
                refs: self.refs(),
            },
            14 => Op::Flush,
            15 => Op::Reopen,
            16 => {
                let seed = self.seed();
                let b = self.byte();
                let recovery_cut = (b & 1 != 0).then(|| (u64::from(b >> 1), self.seed()));
                Op::Crash { seed, recovery_cut }
            }
            _ => Op::CutPower {
                after: u64::from(self.byte()),
                seed: self.seed(),
            },
        }
    }
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    /// `snapshot_at` a batch committed since the last power cut (`pick` % their count).
    PastAt {
        pick: u8,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    /// `snapshot_as_of` the commit time of such a batch.
    PastAsOf {
        pick: u8,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    Add {
        view: Option<&'static str>,
        items: Vec<ItemSpec>,
    },
    Delete(&'static str),
    Get {
        view: Option<&'static str>,
        query: QuerySpec,
    },
    Resolve {
        view: Option<&'static str>,
        refs: Vec<Ref>,
    },
    /// Takes a live snapshot handle (of the store or of a session view).
    Snapshot {
        view: Option<&'static str>,
    },
    /// Reads the live snapshot `snap % count` with `get` and `resolve` (skipped when there is none).
    ReadSnap {
        snap: usize,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    Advance(i64),
    Compact,
    Pin {
        name: &'static str,
        view: Option<&'static str>,
    },
    Unpin(&'static str),
    /// `open_snapshot`, then `get`, `resolve` and `digest` through it; the handle is kept as a live
    /// snapshot.
    OpenPinned {
        name: &'static str,
        query: QuerySpec,
        refs: Vec<Ref>,
    },
    Flush,
    /// Closes the store and opens it again.
    Reopen,
    /// Cuts the power now; the disk comes back as `seed` decides. With `recovery_cut`, the power is
    /// cut again after that many storage calls of the recovery (open and close), and the disk comes
    /// back again.
    Crash {
        seed: u64,
        recovery_cut: Option<(u64, u64)>,
    },
    /// Cuts the power after `after` more storage calls (inside the next operations, or between two),
    /// then the disk comes back as `seed` decides.
    CutPower {
        after: u64,
        seed: u64,
    },
}

fn subset<T: Copy>(from: &[T], mask: u8) -> Vec<T> {
    from.iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, value)| *value)
        .collect()
}

/// What an input means: the durability and whether content is compressed, then the operations.
pub(super) fn decode(data: &[u8]) -> (Durability, bool, bool, Vec<Op>) {
    let mut input = Input { bytes: data, at: 0 };
    let first = input.byte();
    let subscribe = first & 4 == 4;
    let durability = if first & 1 == 1 {
        Durability::Never
    } else {
        Durability::Immediate
    };
    let compress = first & 2 == 2;
    let mut ops = Vec::new();
    while !input.is_empty() && ops.len() < OPS_MAX {
        ops.push(input.op());
    }
    (durability, compress, subscribe, ops)
}
