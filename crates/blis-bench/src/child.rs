//! A child process waited for within a bound and killed by its id when it overruns or when it is
//! dropped (a bench that fails half-way leaves nothing running).

use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct Child {
    child: std::process::Child,
    name: &'static str,
    done: bool,
}

impl Child {
    pub fn spawn(mut command: Command, name: &'static str) -> anyhow::Result<Child> {
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", command.get_program()))?;
        Ok(Child {
            child,
            name,
            done: false,
        })
    }

    /// Its exit status, once it exits within `limit`; killed (and an error) otherwise.
    pub fn wait_for(&mut self, limit: Duration) -> anyhow::Result<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                self.done = true;
                return Ok(status);
            }
            if started.elapsed() >= limit {
                self.kill();
                bail!("{} did not finish within {:?}: stopped", self.name, limit);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.done = true;
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
        }
    }
}
