//! Threaded stress (issue 8): producer threads submit, cancel and resume
//! random handles while the owner loop closes in DRAIN or CANCEL at a random
//! moment. Checks exactly-once completion per issued handle, no handle
//! reused, no cancel lost (a job that only a cancel can end always ends
//! `Aborted`), and counters that match what the producers saw.
//!
//! `XTC_MT_STRESS_ROUNDS` (default 8) and `XTC_MT_STRESS_SEED` tune it; a
//! watchdog aborts a round that does not finish in 120 s (a lost wake or a
//! lost cancel would hang it), printing the seed.

use super::*;

const PRODUCERS: u64 = 3;
const PER_PRODUCER: usize = 200;
const OWNER_SUBMITS: usize = 5;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct ProducerLog {
    issued: Vec<(Handle, Kind)>,
    /// Handles whose random cancel_mt was accepted.
    cancelled: HashSet<u64>,
    /// `Again` answers (submits and controls): must equal `mt_rejections`.
    agains: u64,
    /// Outcomes as the producer's notes told them.
    outcomes: HashMap<u64, Result<(), Error>>,
}

struct Producer {
    remote: Remote<Job>,
    rng: fastrand::Rng,
    closed: Arc<AtomicBool>,
    log: ProducerLog,
}

impl Producer {
    /// A control that must land: retried on `Again`; `Inval` only once the
    /// group is closed (the driver may have finished).
    fn control(&mut self, h: Handle, cancel: bool) -> bool {
        loop {
            let r = if cancel {
                self.remote.cancel(h)
            } else {
                self.remote.resume(h)
            };
            match r {
                Ok(()) => return true,
                Err(Error::Again) => {
                    self.log.agains += 1;
                    thread::yield_now();
                }
                Err(e) => {
                    assert_eq!(e, Error::Inval);
                    assert!(self.closed.load(Ordering::SeqCst), "Inval before close");
                    return false;
                }
            }
        }
    }

    fn on_note(&mut self, note: Note) {
        match note {
            Note::Blocked(h) => {
                let kind = self.log.issued.iter().find(|i| i.0 == h).expect("mine").1;
                self.control(h, kind == Kind::BlockCancel);
            }
            Note::Done(h, out) => {
                let dup = self.log.outcomes.insert(h.get(), out);
                assert!(dup.is_none(), "second completion of {h}");
            }
        }
    }

    fn kind(&mut self) -> Kind {
        match self.rng.u8(..10) {
            0 => Kind::BlockResume,
            1 => Kind::BlockCancel,
            _ => Kind::Run(self.rng.u32(1..4)),
        }
    }

    /// One submit; `false` once submitting is over.
    fn submit(&mut self, tx: &Sender<Note>) -> bool {
        let kind = self.kind();
        let after_close = self.closed.load(Ordering::SeqCst);
        match self
            .remote
            .submit(job(kind, Some(tx.clone())), self.rng.u64(1..=5))
        {
            Ok(h) => {
                assert!(!after_close, "submit_mt accepted after close returned");
                self.log.issued.push((h, kind));
                self.log.issued.len() < PER_PRODUCER
            }
            Err(e) => {
                assert_eq!(e.error, Error::Again);
                self.log.agains += 1;
                thread::yield_now();
                !after_close
            }
        }
    }

    /// A random extra cancel (any own handle) or resume (a Run job's).
    fn random_control(&mut self) {
        if self.log.issued.is_empty() || self.rng.u8(..8) != 0 {
            return;
        }
        let (h, kind) = self.log.issued[self.rng.usize(..self.log.issued.len())];
        if self.rng.bool() {
            if self.control(h, true) {
                self.log.cancelled.insert(h.get());
            }
        } else if matches!(kind, Kind::Run(_)) {
            self.control(h, false);
        }
    }

    fn run(mut self) -> ProducerLog {
        let (tx, rx) = unbounded();
        let mut submitting = true;
        loop {
            while let Ok(note) = rx.try_recv() {
                self.on_note(note);
            }
            if submitting {
                submitting = self.submit(&tx);
                self.random_control();
            } else if self.log.outcomes.len() == self.log.issued.len() {
                return self.log;
            } else {
                let note = rx.recv().expect("requests hold a sender");
                self.on_note(note);
            }
        }
    }
}

/// Starts a thread that aborts the process unless told within 120 s.
fn watchdog(round: u64, seed: u64) -> Sender<()> {
    let (tx, rx) = unbounded::<()>();
    thread::spawn(move || {
        if rx.recv_timeout(Duration::from_secs(120)).is_err() {
            eprintln!("batch_mt stress round {round} (seed {seed}) hung for 120 s");
            std::process::abort();
        }
    });
    tx
}

fn round(round: u64, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mode = if round.is_multiple_of(2) {
        CloseMode::Drain
    } else {
        CloseMode::Cancel
    };
    let lp = Loop::new().unwrap();
    let (g, done) = group(&lp, 4 + rng.usize(..4), 4 + rng.usize(..8));
    let remote = g.remote().unwrap();
    let closed = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let prod = Producer {
                remote: remote.clone(),
                rng: fastrand::Rng::with_seed(seed ^ ((p + 1) * 0x9e37_79b9)),
                closed: closed.clone(),
                log: ProducerLog::default(),
            };
            thread::spawn(move || prod.run())
        })
        .collect();
    let owner_handles = Arc::new(Mutex::new(Vec::new()));
    let (g2, c2, o2) = (g.clone(), closed.clone(), owner_handles.clone());
    let delay = Duration::from_micros(rng.u64(..3000));
    lp.spawn(async move {
        rt::sleep(delay).await;
        for _ in 0..OWNER_SUBMITS {
            loop {
                match g2.submit(job(Kind::Run(1), None), 1) {
                    Ok(h) => break o2.lock().unwrap().push(h.get()),
                    Err(e) if e.error == Error::Again => rt::yield_now().await,
                    Err(e) => panic!("owner submit: {e}"),
                }
            }
        }
        g2.close(mode).unwrap();
        c2.store(true, Ordering::SeqCst);
    })
    .unwrap();
    let alarm = watchdog(round, seed);
    lp.run().unwrap();
    let logs: Vec<ProducerLog> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    alarm.send(()).unwrap();
    check(&g, mode, &done, &logs, &owner_handles.lock().unwrap());
    g.destroy().unwrap();
}

fn check(g: &Group<Job>, mode: CloseMode, done: &Completions, logs: &[ProducerLog], owner: &[u64]) {
    let mut outcomes: HashMap<u64, Result<(), Error>> = HashMap::new();
    for (h, o) in done.lock().unwrap().iter() {
        assert!(
            outcomes.insert(*h, *o).is_none(),
            "handle {h} completed twice"
        );
    }
    let mut issued: HashSet<u64> = owner.iter().copied().collect();
    for log in logs {
        for (h, kind) in &log.issued {
            assert!(issued.insert(h.get()), "handle {h} issued twice");
            let out = outcomes[&h.get()];
            assert_eq!(log.outcomes[&h.get()], out);
            let may_abort = mode == CloseMode::Cancel || log.cancelled.contains(&h.get());
            match kind {
                Kind::BlockCancel => assert_eq!(out, Err(Error::Aborted), "cancel lost for {h}"),
                _ if may_abort => assert!(matches!(out, Ok(()) | Err(Error::Aborted))),
                _ => assert_eq!(out, Ok(()), "{h} ({kind:?})"),
            }
        }
    }
    assert_eq!(
        issued,
        outcomes.keys().copied().collect(),
        "a completion per handle"
    );
    let (s, a) = (g.stats(), g.async_stats());
    assert_eq!(s.completed + s.cancelled, issued.len() as u64);
    assert_eq!(s.failed, 0);
    let mt_issued: usize = logs.iter().map(|l| l.issued.len()).sum();
    assert_eq!(a.mt_queued, mt_issued as u64);
    assert_eq!(a.mt_rejections, logs.iter().map(|l| l.agains).sum::<u64>());
    eprintln!(
        "{mode:?}: {} handles ({mt_issued} mt), {} aborted, {} mt_rejections",
        issued.len(),
        s.cancelled,
        a.mt_rejections
    );
}

#[test]
fn producers_race_a_random_close() {
    let base = env_u64("XTC_MT_STRESS_SEED", 0x5eed_0008);
    for r in 0..env_u64("XTC_MT_STRESS_ROUNDS", 8) {
        round(r, base.wrapping_add(r));
    }
}
