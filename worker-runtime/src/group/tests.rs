//! In-process checks on a one-rank group (this process hosts the store).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tch::{Kind, Tensor};

use super::{GroupOptions, ProcessGroup, ReduceOp};
use crate::error::GroupError;

/// One group per process at a time: the tests take turns.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn solo() -> ProcessGroup {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port");
    ProcessGroup::join(&GroupOptions {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank: 0,
        world_size: 1,
        host_store: true,
        timeout: Duration::from_secs(30),
    })
    .expect("join a one-rank group")
}

#[test]
fn one_rank_collectives_are_identities() {
    let _serial = serial();
    let group = solo();
    let mut t = Tensor::from_slice(&[1.5f32, -2.0]);
    for op in [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Product,
    ] {
        group.all_reduce(&mut t, op).expect("all_reduce");
    }
    assert_eq!(Vec::<f32>::try_from(&t).expect("values"), vec![1.5, -2.0]);
    group.broadcast(&mut t, 0).expect("broadcast");
    let all = group.all_gather(&t).expect("all_gather");
    assert_eq!(all.len(), 1);
    assert_eq!(
        Vec::<f32>::try_from(&all[0]).expect("values"),
        vec![1.5, -2.0]
    );
    let mut out = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
    group
        .reduce_scatter(&mut out, &[t.shallow_clone()], ReduceOp::Sum)
        .expect("reduce_scatter");
    assert_eq!(Vec::<f32>::try_from(&out).expect("values"), vec![1.5, -2.0]);
    group.barrier().expect("barrier");
}

#[test]
fn bad_arguments_are_errors_before_c10d() {
    let _serial = serial();
    let group = solo();
    let mut transposed = Tensor::ones([2, 3], (Kind::Float, tch::Device::Cpu)).tr();
    let err = group
        .all_reduce(&mut transposed, ReduceOp::Sum)
        .expect_err("non-contiguous");
    assert!(err.to_string().contains("not contiguous"), "{err}");

    let mut t = Tensor::from_slice(&[1.0f32]);
    let err = group.broadcast(&mut t, 1).expect_err("root out of range");
    assert!(
        matches!(
            err,
            GroupError::InvalidArgument {
                op: "broadcast",
                ..
            }
        ),
        "{err:?}"
    );

    let err = group
        .reduce_scatter(&mut t, &[], ReduceOp::Sum)
        .expect_err("no inputs");
    assert!(
        err.to_string()
            .contains("0 inputs given, one per rank is 1"),
        "{err}"
    );

    let long = Tensor::from_slice(&[1.0f32, 2.0]);
    let err = group
        .reduce_scatter(&mut t, &[long], ReduceOp::Sum)
        .expect_err("shape mismatch");
    assert!(err.to_string().contains("they must match"), "{err}");

    let mut undefined = Tensor::new();
    let err = group
        .all_reduce(&mut undefined, ReduceOp::Sum)
        .expect_err("undefined");
    assert!(err.to_string().contains("undefined"), "{err}");
}

#[test]
fn c10d_errors_come_back_typed() {
    let _serial = serial();
    let group = solo();
    // gloo has no AVG for integers: c10d throws, we get an Err.
    let mut ints = Tensor::from_slice(&[1i64, 2]);
    let err = group
        .all_reduce(&mut ints, ReduceOp::Avg)
        .expect_err("integer average");
    assert!(
        matches!(
            err,
            GroupError::Collective {
                op: "all_reduce",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn only_one_live_group_per_process() {
    let _serial = serial();
    let first = solo();
    let err = ProcessGroup::join(&GroupOptions {
        master_addr: "127.0.0.1".into(),
        master_port: 1,
        rank: 0,
        world_size: 1,
        host_store: false,
        timeout: Duration::from_secs(1),
    })
    .expect_err("second group");
    assert!(
        err.to_string().contains("already has a live process group"),
        "{err}"
    );
    drop(first);
    let _again = solo();
}
