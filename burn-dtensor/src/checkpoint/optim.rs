//! Optimizer state in a sharded checkpoint: the per-parameter state of Burn's `SimpleOptimizer`s
//! (Adam's and AdamW's moments and step count; SGD without momentum has none), saved under the
//! parameter's module path (`optim.dense1.weight.moment_1`) in the parameter's layout, so that
//! it reshards on load exactly as the parameter does (PyTorch DCP flattens the optimizer state
//! dict by parameter name the same way).

use std::collections::HashMap;

use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::record::AdaptorRecord;
use burn::optim::{
    Adam, AdamState, AdamW, AdamWState, AdaptiveMomentumState, Optimizer, Sgd, SgdState,
    SimpleOptimizer,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Float, Tensor};

use super::{Checkpoint, StateDict, ckpt_err};
use crate::api::{DTensorExt, DistributedOps};
use crate::error::{DTensorError, Result};

/// The tensors and step counters of one parameter's optimizer state (tensors of the parameter's
/// global shape).
pub struct StateParts<B: Backend, const D: usize> {
    /// Tensors by name (`moment_1`), in [`ShardedOptimizer::TENSORS`] order.
    pub tensors: Vec<Tensor<B, D>>,
    /// Counters by name (`time`), in [`ShardedOptimizer::COUNTERS`] order.
    pub counters: Vec<u64>,
}

/// A Burn `SimpleOptimizer` whose per-parameter state a sharded checkpoint can hold: the state
/// as named tensors of the parameter's shape plus named counters.
pub trait ShardedOptimizer<B: Backend>: SimpleOptimizer<B> {
    /// Names of the state's tensors (`["moment_1", "moment_2"]` for Adam).
    const TENSORS: &'static [&'static str];
    /// Names of the state's counters (`["time"]` for Adam).
    const COUNTERS: &'static [&'static str];
    /// The state's parts.
    ///
    /// # Errors
    /// [`DTensorError::Unsupported`] for a state this build cannot take apart.
    fn into_parts<const D: usize>(state: Self::State<D>) -> Result<StateParts<B, D>>;
    /// The state from its parts.
    fn from_parts<const D: usize>(parts: StateParts<B, D>) -> Self::State<D>;
}

fn adaptive<B: Backend, const D: usize>(
    m: AdaptiveMomentumState<B, D>,
) -> Result<StateParts<B, D>> {
    if m.max_moment_2.is_some() {
        return Err(DTensorError::Unsupported(
            "AMSGrad's running maximum is not saved in sharded checkpoints yet; use Adam without \
             amsgrad"
                .into(),
        ));
    }
    Ok(StateParts {
        tensors: vec![m.moment_1, m.moment_2],
        counters: vec![m.time as u64],
    })
}

fn adaptive_from<B: Backend, const D: usize>(
    mut p: StateParts<B, D>,
) -> AdaptiveMomentumState<B, D> {
    let moment_2 = p.tensors.pop().expect("two tensors");
    let moment_1 = p.tensors.pop().expect("two tensors");
    AdaptiveMomentumState {
        time: p.counters[0] as usize,
        moment_1,
        moment_2,
        max_moment_2: None,
    }
}

impl<B: Backend> ShardedOptimizer<B> for Adam {
    const TENSORS: &'static [&'static str] = &["moment_1", "moment_2"];
    const COUNTERS: &'static [&'static str] = &["time"];
    fn into_parts<const D: usize>(state: AdamState<B, D>) -> Result<StateParts<B, D>> {
        adaptive(state.momentum)
    }
    fn from_parts<const D: usize>(parts: StateParts<B, D>) -> AdamState<B, D> {
        AdamState {
            momentum: adaptive_from(parts),
        }
    }
}

impl<B: Backend> ShardedOptimizer<B> for AdamW {
    const TENSORS: &'static [&'static str] = &["moment_1", "moment_2"];
    const COUNTERS: &'static [&'static str] = &["time"];
    fn into_parts<const D: usize>(state: AdamWState<B, D>) -> Result<StateParts<B, D>> {
        adaptive(state.momentum)
    }
    fn from_parts<const D: usize>(parts: StateParts<B, D>) -> AdamWState<B, D> {
        AdamWState {
            momentum: adaptive_from(parts),
        }
    }
}

/// SGD without momentum (its state holds nothing). Burn 0.21's `MomentumState` has no public
/// constructor, so SGD's momentum buffers cannot be rebuilt from shards: saving them is a typed
/// error.
impl<B: Backend> ShardedOptimizer<B> for Sgd<B> {
    const TENSORS: &'static [&'static str] = &[];
    const COUNTERS: &'static [&'static str] = &[];
    fn into_parts<const D: usize>(state: SgdState<B, D>) -> Result<StateParts<B, D>> {
        if state.momentum.is_some() {
            return Err(DTensorError::Unsupported(
                "SGD's momentum buffers cannot be saved in a sharded checkpoint (Burn 0.21's \
                 MomentumState cannot be rebuilt from its tensors); use Adam or SGD without momentum"
                    .into(),
            ));
        }
        Ok(StateParts {
            tensors: Vec::new(),
            counters: Vec::new(),
        })
    }
    fn from_parts<const D: usize>(_parts: StateParts<B, D>) -> SgdState<B, D> {
        SgdState { momentum: None }
    }
}

fn key(prefix: &str, path: &str, part: &str) -> String {
    format!("{prefix}.{path}.{part}")
}

/// How state tensors of backend `B` go into a state dict and come back from a checkpoint:
/// [`Sharded`] keeps each tensor's layout (its shards are written and read), [`Whole`] moves
/// whole tensors of a plain backend (the chief writes them; every process reads them whole).
trait StateIo<B: Backend> {
    fn put<const D: usize>(state: &mut StateDict, name: String, t: Tensor<B, D>) -> Result<()>;
    /// The saved tensor `name` as a tensor like `like` (same global shape, dtype, layout or
    /// device).
    fn get<const D: usize>(
        ckpt: &Checkpoint,
        name: &str,
        like: &Tensor<B, D>,
    ) -> Result<Tensor<B, D>>;
}

struct Sharded;

impl<B: DistributedOps> StateIo<B> for Sharded {
    fn put<const D: usize>(state: &mut StateDict, name: String, t: Tensor<B, D>) -> Result<()> {
        state.insert(name, t)
    }
    fn get<const D: usize>(
        ckpt: &Checkpoint,
        name: &str,
        like: &Tensor<B, D>,
    ) -> Result<Tensor<B, D>> {
        let layout = DTensorExt::layout(like);
        ckpt.read_as::<B, D, Float>(name, like.dims(), &layout, Some(like.dtype()))
    }
}

struct Whole;

impl<B: Backend> StateIo<B> for Whole {
    fn put<const D: usize>(state: &mut StateDict, name: String, t: Tensor<B, D>) -> Result<()> {
        state.insert_data(name, t.into_data())
    }
    fn get<const D: usize>(
        ckpt: &Checkpoint,
        name: &str,
        like: &Tensor<B, D>,
    ) -> Result<Tensor<B, D>> {
        ckpt.tensor_like(name, &like.dims(), "Float")?;
        let mut d = ckpt.read_whole(name)?;
        if d.dtype != like.dtype() {
            d = d.convert_dtype(like.dtype());
        }
        Ok(Tensor::from_data(d, &like.device()))
    }
}

/// What [`walk`] does with each float parameter of a model, given its module path
/// (`dense1.weight`).
trait PerParam<AB: AutodiffBackend> {
    fn param<const D: usize>(&mut self, path: &str, param: &Param<Tensor<AB, D>>) -> Result<()>;
}

/// The module visitor behind [`walk`]: the path of the parameter being visited, and the first
/// error (after which the other parameters are skipped).
struct Walk<V> {
    path: Vec<String>,
    error: Option<DTensorError>,
    per_param: V,
}

impl<AB: AutodiffBackend, V: PerParam<AB>> ModuleVisitor<AB> for Walk<V> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.per_param.param(&self.path.join("."), param) {
            self.error = Some(e);
        }
    }
}

/// Runs `per_param` on every float parameter of `model`, in the visit's order; the first error.
fn walk<AB: AutodiffBackend, M: AutodiffModule<AB>, V: PerParam<AB>>(
    model: &M,
    per_param: V,
) -> Result<V> {
    let mut w = Walk {
        path: Vec::new(),
        error: None,
        per_param,
    };
    model.visit(&mut w);
    w.error.map_or(Ok(w.per_param), Err)
}

/// The optimizer's state, parameter by parameter of `model` (the visit gives each parameter's
/// rank), into a state dict.
struct Collect<'a, O, AB, Io>
where
    AB: AutodiffBackend,
    O: SimpleOptimizer<AB::InnerBackend>,
{
    prefix: &'a str,
    records: HashMap<ParamId, AdaptorRecord<O, AB>>,
    state: &'a mut StateDict,
    io: std::marker::PhantomData<Io>,
}

impl<O, AB, Io> PerParam<AB> for Collect<'_, O, AB, Io>
where
    AB: AutodiffBackend,
    O: ShardedOptimizer<AB::InnerBackend>,
    Io: StateIo<AB::InnerBackend>,
{
    fn param<const D: usize>(&mut self, path: &str, param: &Param<Tensor<AB, D>>) -> Result<()> {
        let Some(record) = self.records.remove(&param.id) else {
            return Ok(()); // no state yet (the parameter was never stepped)
        };
        let parts = O::into_parts(record.into_state::<D>())?;
        for (name, t) in O::TENSORS.iter().zip(parts.tensors) {
            Io::put(self.state, key(self.prefix, path, name), t)?;
        }
        for (name, v) in O::COUNTERS.iter().zip(parts.counters) {
            self.state.insert_counter(key(self.prefix, path, name), v)?;
        }
        if O::TENSORS.is_empty() && O::COUNTERS.is_empty() {
            // A state with nothing in it still marks the parameter as stepped.
            self.state
                .insert_counter(key(self.prefix, path, "stepped"), 1)?;
        }
        Ok(())
    }
}

fn collect<AB, M, O, Io>(
    state: &mut StateDict,
    prefix: &str,
    model: &M,
    optim: &OptimizerAdaptor<O, M, AB>,
) -> Result<()>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
    O: ShardedOptimizer<AB::InnerBackend>,
    Io: StateIo<AB::InnerBackend>,
{
    let c = Collect::<O, AB, Io> {
        prefix,
        records: optim.to_record().into_iter().collect(),
        state,
        io: std::marker::PhantomData,
    };
    walk(model, c).map(|_| ())
}

impl StateDict {
    /// Adds the state of `optim` for every parameter of `model` under `prefix`
    /// (`optim.dense1.weight.moment_1`, `optim.dense1.weight.time`): each state tensor in its
    /// current layout (that of its parameter's gradient), so it is saved as its shards.
    ///
    /// # Errors
    /// [`DTensorError::Unsupported`] for a state that cannot be taken apart (SGD momentum), as
    /// [`StateDict::insert`] otherwise.
    pub fn insert_optimizer<AB, M, O>(
        &mut self,
        prefix: &str,
        model: &M,
        optim: &OptimizerAdaptor<O, M, AB>,
    ) -> Result<()>
    where
        AB: AutodiffBackend,
        AB::InnerBackend: DistributedOps,
        M: AutodiffModule<AB>,
        O: ShardedOptimizer<AB::InnerBackend>,
    {
        collect::<AB, M, O, Sharded>(self, prefix, model, optim)
    }

    /// [`StateDict::insert_optimizer`] for a model of a plain backend (no mesh): each state
    /// tensor is saved whole, by the chief ([`StateDict::insert_data`]), under the same names,
    /// so that the checkpoint loads on any mesh ([`Checkpoint::load_optimizer`]) as well as
    /// whole ([`Checkpoint::load_optimizer_whole`]).
    ///
    /// # Errors
    /// As [`StateDict::insert_optimizer`].
    pub fn insert_optimizer_whole<AB, M, O>(
        &mut self,
        prefix: &str,
        model: &M,
        optim: &OptimizerAdaptor<O, M, AB>,
    ) -> Result<()>
    where
        AB: AutodiffBackend,
        M: AutodiffModule<AB>,
        O: ShardedOptimizer<AB::InnerBackend>,
    {
        collect::<AB, M, O, Whole>(self, prefix, model, optim)
    }
}

/// The optimizer's state from a checkpoint, parameter by parameter of `model`.
struct Load<'a, O, AB, Io>
where
    AB: AutodiffBackend,
    O: SimpleOptimizer<AB::InnerBackend>,
{
    ckpt: &'a Checkpoint,
    prefix: &'a str,
    records: HashMap<ParamId, AdaptorRecord<O, AB>>,
    io: std::marker::PhantomData<Io>,
}

impl<O, AB, Io> PerParam<AB> for Load<'_, O, AB, Io>
where
    AB: AutodiffBackend,
    O: ShardedOptimizer<AB::InnerBackend>,
    Io: StateIo<AB::InnerBackend>,
{
    fn param<const D: usize>(&mut self, path: &str, param: &Param<Tensor<AB, D>>) -> Result<()> {
        let meta = &self.ckpt.meta;
        let first = O::TENSORS
            .first()
            .or(O::COUNTERS.first())
            .copied()
            .unwrap_or("stepped");
        let k = key(self.prefix, path, first);
        if !meta.tensors.contains_key(&k) && !meta.counters.contains_key(&k) {
            return Ok(()); // the parameter had no state when saved
        }
        let value = param.val().inner();
        let mut tensors = Vec::with_capacity(O::TENSORS.len());
        for name in O::TENSORS {
            tensors.push(Io::get(self.ckpt, &key(self.prefix, path, name), &value)?);
        }
        let mut counters = Vec::with_capacity(O::COUNTERS.len());
        for name in O::COUNTERS {
            let k = key(self.prefix, path, name);
            counters.push(*meta.counters.get(&k).ok_or_else(|| {
                ckpt_err(
                    &self.ckpt.dir,
                    format!("no counter `{k}`: the optimizer state of `{path}` is incomplete"),
                )
            })?);
        }
        let parts = StateParts { tensors, counters };
        let record = AdaptorRecord::from_state::<D>(O::from_parts(parts));
        self.records.insert(param.id, record);
        Ok(())
    }
}

fn load<AB, M, O, Io>(
    ckpt: &Checkpoint,
    prefix: &str,
    model: &M,
    optim: OptimizerAdaptor<O, M, AB>,
) -> Result<OptimizerAdaptor<O, M, AB>>
where
    AB: AutodiffBackend,
    M: AutodiffModule<AB>,
    O: ShardedOptimizer<AB::InnerBackend>,
    Io: StateIo<AB::InnerBackend>,
{
    let l = Load::<O, AB, Io> {
        ckpt,
        prefix,
        records: HashMap::new(),
        io: std::marker::PhantomData,
    };
    let l = walk(model, l)?;
    Ok(optim.load_record(l.records.into_iter().collect()))
}

impl Checkpoint {
    /// Loads the state of `optim` for every parameter of `model` (the model being resumed, laid
    /// out for the current mesh) from the entries under `prefix` that
    /// [`StateDict::insert_optimizer`] wrote: each state tensor in its parameter's current layout,
    /// each process reading only its shards. Parameters without saved state start without state.
    ///
    /// # Errors
    /// [`DTensorError::Checkpoint`] for a state tensor of another shape or missing pieces, as
    /// [`Checkpoint::read`] otherwise.
    pub fn load_optimizer<AB, M, O>(
        &self,
        prefix: &str,
        model: &M,
        optim: OptimizerAdaptor<O, M, AB>,
    ) -> Result<OptimizerAdaptor<O, M, AB>>
    where
        AB: AutodiffBackend,
        AB::InnerBackend: DistributedOps,
        M: AutodiffModule<AB>,
        O: ShardedOptimizer<AB::InnerBackend>,
    {
        load::<AB, M, O, Sharded>(self, prefix, model, optim)
    }

    /// [`Checkpoint::load_optimizer`] for a model of a plain backend (no mesh): each state
    /// tensor is read whole onto its parameter's device. With
    /// [`Checkpoint::load_module_whole`], the way to leave the mesh and go on training.
    ///
    /// # Errors
    /// As [`Checkpoint::load_optimizer`].
    pub fn load_optimizer_whole<AB, M, O>(
        &self,
        prefix: &str,
        model: &M,
        optim: OptimizerAdaptor<O, M, AB>,
    ) -> Result<OptimizerAdaptor<O, M, AB>>
    where
        AB: AutodiffBackend,
        M: AutodiffModule<AB>,
        O: ShardedOptimizer<AB::InnerBackend>,
    {
        load::<AB, M, O, Whole>(self, prefix, model, optim)
    }
}
