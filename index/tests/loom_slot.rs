//! A loom model of the slot seqlock: with a writer replacing a slot's words while a reader reads
//! it, under every interleaving loom explores, the reader sees either the old words or the new
//! ones, never a mix. Run with `RUSTFLAGS="--cfg loom" cargo test -p orbitkv-index --test
//! loom_slot --release`.

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use orbitkv_index::slot::{Slot, WORDS};

#[test]
fn reader_sees_old_or_new_words_never_a_mix() {
    loom::model(|| {
        let slot = Arc::new(Slot::default());
        let old = [1u64 << 32, 1, 1, 1, 1, 1, 1, 1];
        let new = [2u64 << 32, 2, 2, 2, 2, 2, 2, 2];
        slot.write(old);
        let writer = {
            let slot = slot.clone();
            thread::spawn(move || slot.write(new))
        };
        let got: [u64; WORDS] = slot.read(thread::yield_now);
        assert!(got == old || got == new, "mixed read {got:?}");
        writer.join().unwrap_or_else(|_| panic!("writer panicked"));
        assert_eq!(slot.read(thread::yield_now), new);
    });
}
