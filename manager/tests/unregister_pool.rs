//! UnregisterPool: a worker ends a pool's registration and hears back only once the daemon has
//! let go of the pool's memory, so the engine may free it. Afterwards no copy reaches the pool
//! (a Load naming it is answered `unknown pool` per page), the same id registers again, and
//! ending an unknown pool, or ending one from the scheduler's session, is refused.

mod common;

use common::pages::{acquire, fill, load, publish, register_pool};
use common::{Daemon, seal};
use orbitkv_gpu_bridge::PoolId;
use orbitkv_protocol::client::ClientError;
use orbitkv_protocol::{ErrorCode, PageStatus};
use orbitkv_sim::SimInstance;

#[test]
fn an_unregistered_pool_is_let_go_of_and_never_copied_into() {
    let d = Daemon::start();
    let sim = SimInstance::new("unregister", 1);
    let mut s = seal(&d, &sim);
    let pool = register_pool(&mut s, &sim);
    let pages: Vec<_> = (0..2).map(|b| (b, fill(&sim, &pool, b, b))).collect();
    assert_eq!(publish(&mut s, &sim, &pages), vec![PageStatus::Ok; 2]);
    let (worker, token) = &mut s.workers[0];
    let token = *token;
    worker
        .unregister_pool(token, PoolId(1))
        .unwrap_or_else(|e| panic!("{e}"));
    // The pool is gone: a Load into it touches nothing.
    let (lease, _) = acquire(&mut s, 2, 32);
    let dst = pool.reuse(8).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        load(&mut s, lease, &[(0, dst, 0, 2)]),
        vec![PageStatus::UnknownPool]
    );
    // Once more: an unknown pool.
    match s.workers[0].0.unregister_pool(token, PoolId(1)) {
        Err(ClientError::Refused {
            code: ErrorCode::Malformed,
            detail,
            ..
        }) => assert!(detail.contains("pool 1"), "{detail}"),
        other => panic!("{other:?}"),
    }
    // The scheduler registers no pools and ends none.
    let st = s.token;
    match s.scheduler.unregister_pool(st, PoolId(1)) {
        Err(ClientError::Refused {
            code: ErrorCode::Malformed,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // The same id registers again and serves.
    let pool = register_pool(&mut s, &sim);
    let (lease, _) = acquire(&mut s, 2, 32);
    let dst = pool.reuse(8).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(load(&mut s, lease, &[(1, dst, 0, 2)]), vec![PageStatus::Ok]);
}
