//! [`Batch`]: commands of many jobs sent in one round trip (per primary on a cluster).

use redis::{Cmd, Pipeline, Script};

use super::*;

/// Commands for [`Conn::batch`]: each touches keys of one slot (one job's hash tag), and may be
/// a script call ([`Batch::script`]), whose script is loaded in the same round trip.
#[derive(Default)]
pub struct Batch {
    pub(super) cmds: Vec<Cmd>,
    pub(super) slots: Vec<u16>,
    pub(super) scripts: Vec<&'static Script>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// How many commands were added.
    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    /// Adds `cmd`, whose keys share the slot of `key`; returns its index in the replies.
    pub fn cmd(&mut self, key: &str, cmd: Cmd) -> usize {
        self.cmds.push(cmd);
        self.slots.push(slot_of(key));
        self.cmds.len() - 1
    }

    /// Adds a call of `script` with `keys` (sharing one slot) and `args`; returns its index.
    pub fn script<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(
        &mut self,
        script: &'static Script,
        keys: &[K],
        args: A,
    ) -> usize {
        if !self.scripts.iter().any(|s| std::ptr::eq(*s, script)) {
            self.scripts.push(script);
        }
        let mut c = redis::cmd("EVALSHA");
        c.arg(script.get_hash()).arg(keys.len()).arg(keys).arg(args);
        let first = keys
            .first()
            .map(|k| k.to_redis_args())
            .and_then(|a| a.into_iter().next())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        self.cmd(&first, c)
    }

    /// The scripts' loads, then every command.
    pub(super) fn pipeline(&self, idx: std::ops::Range<usize>) -> Pipeline {
        self.pipeline_of(&idx.collect::<Vec<_>>())
    }

    pub(super) fn pipeline_of(&self, idx: &[usize]) -> Pipeline {
        let mut pipe = redis::pipe();
        for s in &self.scripts {
            pipe.load_script(s);
        }
        for i in idx {
            pipe.add_command(self.cmds[*i].clone());
        }
        pipe
    }
}
