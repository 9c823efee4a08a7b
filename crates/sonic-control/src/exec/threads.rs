//! Where job executions run: by default on the runtime that started them (the API's); with an
//! [`Executor`], on threads of their own at a lower scheduling priority, a bulkhead between
//! the API and the executions.
//!
//! Why: on a busy control plane, the executions of jobs just submitted (their records, their
//! requests to agents, their ends and refits) take the CPU the submissions still coming need,
//! and those are answered late (docs/load.md, "Executions at a lower priority"). With the
//! executions on threads of their own the operating system's scheduler gives the API's
//! threads the CPU first; when the API is idle the executions have the whole machine, so a
//! lone job is as fast as before.

use std::io;

/// The most threads an [`Executor`] runs blocking work on (database reads, a local object
/// store's files); more blocking calls at once wait for one of them. Tokio's default is 512: a
/// burst of 500 jobs started about 200 threads, each a stack and a malloc arena to fault in,
/// to wait in turn for the database's four readers (docs/load.md, "A burst on a fresh control
/// plane, and the next").
pub const MAX_BLOCKING_THREADS: usize = 16;

/// A multi-threaded Tokio runtime for job executions, its threads at a lower priority (a
/// higher `nice` value, Linux; elsewhere they keep the process's priority). Dropping it stops
/// the executions still running on it without waiting for them (what
/// [`crate::Runtime::stop_jobs`] does too).
#[derive(Debug)]
pub struct Executor {
    runtime: Option<tokio::runtime::Runtime>,
    nice: i32,
}

impl Executor {
    /// An executor of `threads` worker threads (at least 1) at niceness `nice` above the
    /// process's (0: the same priority; 1 to 19: lower; Linux nice values). Fails when the
    /// threads cannot be made.
    pub fn new(threads: usize, nice: i32) -> io::Result<Executor> {
        let nice = nice.clamp(0, 19);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .max_blocking_threads(MAX_BLOCKING_THREADS)
            .thread_name("sonic-exec")
            .on_thread_start(move || lower_thread_priority(nice))
            .enable_all()
            .build()?;
        Ok(Executor {
            runtime: Some(runtime),
            nice,
        })
    }

    /// An executor of one worker thread per core this process may use (what the daemon
    /// runs, `ControlConfig::executor_nice`).
    pub fn per_core(nice: i32) -> io::Result<Executor> {
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        Executor::new(threads, nice)
    }

    /// The niceness its threads run at, above the process's.
    pub fn nice(&self) -> i32 {
        self.nice
    }

    /// Where executions are spawned.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime is only taken when dropped")
            .handle()
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        // Dropping a runtime waits for its blocking threads, which an async context must not
        // do: the control plane may be dropped from one.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Raises the calling thread's niceness by `nice` (Linux: the nice value is per thread, and
/// processes the thread starts inherit it). Raising it needs no privilege; a failure leaves the
/// thread as it was, with a warning. Elsewhere than on Linux, it does nothing.
#[allow(unsafe_code)]
pub fn lower_thread_priority(nice: i32) {
    if nice == 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority and setpriority read and change the calling thread's niceness
        // (`who` is its thread id); they touch no memory of ours.
        let (tid, current) = unsafe {
            let tid = libc::gettid() as libc::id_t;
            (tid, libc::getpriority(libc::PRIO_PROCESS, tid))
        };
        let target = (current + nice).min(19);
        // SAFETY: as above.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, target) } != 0 {
            tracing::warn!(
                error = %io::Error::last_os_error(),
                "cannot lower the thread's priority"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Executor;

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn own_nice() -> i32 {
        // SAFETY: reads the calling thread's niceness.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn its_threads_run_at_a_lower_priority_than_the_callers() {
        let before = own_nice();
        let exec = Executor::new(1, 7).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        exec.handle()
            .spawn(async move { tx.send(own_nice()).unwrap() });
        let inside = rx.recv().unwrap();
        assert_eq!(inside, (before + 7).min(19));
        // The caller's own thread is left as it was.
        assert_eq!(own_nice(), before);
    }

    #[test]
    fn dropped_inside_an_async_context_it_does_not_panic() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        outer.block_on(async {
            let exec = Executor::new(2, 0).unwrap();
            let running = exec.handle().spawn(std::future::pending::<()>());
            drop(exec);
            // Its tasks are stopped with it.
            assert!(running.await.unwrap_err().is_cancelled());
        });
    }

    #[test]
    fn its_own_task_may_drop_it() {
        // A job's execution can hold the last reference to the control plane's runtime, and so
        // to the executor it runs on.
        let exec = std::sync::Arc::new(Executor::new(1, 0).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, dropped_outside) = tokio::sync::oneshot::channel::<()>();
        let last = exec.clone();
        exec.handle().spawn(async move {
            dropped_outside.await.unwrap();
            assert_eq!(std::sync::Arc::strong_count(&last), 1);
            drop(last);
            tx.send(()).unwrap();
        });
        drop(exec);
        go.send(()).unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the task ran and dropped the executor without panicking");
    }
}
