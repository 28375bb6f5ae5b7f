//! Layout maps: ordered `regex -> layout` rules over module parameter paths, as Keras'
//! `LayoutMap` (keras.distribution.LayoutMap) and the TensorFlow DTensor tutorial's layout
//! maps. Parameter paths are built from Burn's `ModuleMapper::enter_module`/`exit_module`
//! (`dense1.weight`, `layers.0.bias`).
//!
//! - The **first** rule whose regex matches the path (anywhere, like Keras' `re.search`) wins;
//!   anchor with `^...$` for exact matches.
//! - Unmatched parameters stay replicated.
//! - A rule that matches no parameter is an error ([`DTensorError::UnmatchedRule`]), never
//!   silently ignored.
//! - [`LayoutMap::apply`] materialises each parameter that is still lazy (Burn's initializers
//!   are) directly in its target layout: its initializer runs under that layout as a scoped
//!   creation layout ([`crate::with_creation_layout`]), so every device, and every process of a
//!   multi-process mesh, allocates and draws only its own shard and no process ever holds a
//!   sharded parameter whole (random values are the same for every layout, see
//!   [`crate::random`]). Parameters are materialised in visit order, the same on every process.
//!   It keeps parameter ids (optimizer state stays attached), and installs a load mapper so that a record loaded later (a checkpoint
//!   written under any mesh) is relaid out to the same layout.
//!
//! TOML format (one rule per line, in order):
//! ```toml
//! "dense1\\.weight" = ["unsharded", "model"]
//! "dense2\\.weight" = ["model", "unsharded"]
//! ```
//!
//! ```
//! use burn_dtensor::{LayoutMap, Mesh};
//! let mesh = Mesh::virtual_devices([("batch", 4), ("model", 2)], ())?;
//! let map = LayoutMap::from_toml_str(
//!     r#"
//!     '^dense1\.weight$' = ["unsharded", "model"]
//!     'weight$' = ["model", "unsharded"]
//!     "#,
//! )?;
//! // First match wins; the answer is (index of the rule, layout).
//! let (rule, layout) = map.layout_for("dense1.weight", 2, mesh.topology())?;
//! assert_eq!((rule, layout.sharding_spec()), (Some(0), vec!["unsharded".to_string(), "model".into()]));
//! let (rule, layout) = map.layout_for("dense2.weight", 2, mesh.topology())?;
//! assert_eq!((rule, layout.sharding_spec()), (Some(1), vec!["model".to_string(), "unsharded".into()]));
//! // Unmatched parameters stay replicated.
//! let (rule, layout) = map.layout_for("bn.gamma", 1, mesh.topology())?;
//! assert_eq!((rule, layout.is_replicated()), (None, true));
//! // A rule of another rank than the parameter is an error, not a silent replication.
//! assert!(map.layout_for("dense1.weight", 1, mesh.topology()).is_err());
//! # Ok::<(), burn_dtensor::DTensorError>(())
//! ```

use std::path::Path;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Device as _;
use regex::Regex;

use crate::api::DistributedOps;
use crate::error::{DTensorError, Result};
use crate::layout::Layout;
use crate::mesh::MeshTopology;

/// One rule: a regex over parameter paths and a sharding spec (one entry per dim:
/// [`UNSHARDED`](crate::UNSHARDED) or a mesh axis name).
#[derive(Debug, Clone)]
pub struct LayoutRule {
    /// The regex.
    pub pattern: Regex,
    /// The sharding spec.
    pub spec: Vec<String>,
}

/// Ordered layout rules over parameter paths. See the [module docs](self).
#[derive(Debug, Clone, Default)]
pub struct LayoutMap {
    rules: Vec<LayoutRule>,
}

/// What [`LayoutMap::apply`] did: each parameter's path and layout.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayoutReport {
    /// `path -> layout` for every float parameter, in traversal order (replicated ones too).
    pub assignments: Vec<(String, Layout)>,
}

impl std::fmt::Display for LayoutReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (p, l) in &self.assignments {
            writeln!(f, "  {p}: {l}")?;
        }
        Ok(())
    }
}

impl LayoutMap {
    /// An empty map (everything replicated).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a rule.
    ///
    /// # Errors
    /// [`DTensorError::InvalidRegex`].
    pub fn rule<S: AsRef<str>>(
        mut self,
        pattern: &str,
        spec: impl IntoIterator<Item = S>,
    ) -> Result<Self> {
        let re = Regex::new(pattern).map_err(|e| DTensorError::InvalidRegex {
            pattern: pattern.to_string(),
            reason: e.to_string(),
        })?;
        self.rules.push(LayoutRule {
            pattern: re,
            spec: spec.into_iter().map(|s| s.as_ref().to_string()).collect(),
        });
        Ok(self)
    }

    /// The rules, in order.
    pub fn rules(&self) -> &[LayoutRule] {
        &self.rules
    }

    /// Parses the TOML format of the [module docs](self).
    ///
    /// # Errors
    /// [`DTensorError::LayoutMapFile`] for malformed TOML or a value that is not an array of
    /// strings, [`DTensorError::InvalidRegex`] for a bad pattern.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        Self::parse(text, "<string>")
    }

    /// Reads a TOML layout-map file.
    ///
    /// # Errors
    /// As [`LayoutMap::from_toml_str`], plus [`DTensorError::LayoutMapFile`] when unreadable or
    /// when it holds no rule: a file given to lay parameters out that lays out none is a
    /// mistake (a wrong file, a commented-out map); to keep every parameter replicated, use
    /// no map ([`LayoutMap::new`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let p = path.as_ref();
        let origin = p.display().to_string();
        let text = std::fs::read_to_string(p).map_err(|e| DTensorError::LayoutMapFile {
            path: origin.clone(),
            reason: e.to_string(),
        })?;
        let map = Self::parse(&text, &origin)?;
        if map.rules.is_empty() {
            return Err(DTensorError::LayoutMapFile {
                path: origin,
                reason: "it has no rule, so every parameter would stay replicated; add rules, \
                         or give no layout map to replicate every parameter"
                    .into(),
            });
        }
        Ok(map)
    }

    fn parse(text: &str, origin: &str) -> Result<Self> {
        let err = |reason: String| DTensorError::LayoutMapFile {
            path: origin.to_string(),
            reason,
        };
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            // Line and column (1-based) of where the parser stopped.
            let at = e.span().map_or(String::new(), |r| {
                let before = &text[..r.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {col}: ")
            });
            err(format!(
                "{at}{}",
                e.message().trim_end().replace('\n', "; ")
            ))
        })?;
        let mut map = Self::new();
        for (k, v) in table {
            let arr = v
                .as_array()
                .ok_or_else(|| err(format!("value of `{k}` is not an array of axis names")))?;
            let spec: Vec<String> = arr
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| err(format!("`{k}` has a non-string entry {x}")))
                })
                .collect::<Result<_>>()?;
            map = map.rule(&k, spec)?;
        }
        Ok(map)
    }

    /// The layout for a parameter path and rank (replicated when no rule matches).
    ///
    /// # Errors
    /// [`DTensorError::RuleRankMismatch`], [`DTensorError::UnknownAxis`],
    /// [`DTensorError::AxisUsedTwice`].
    pub fn layout_for(
        &self,
        path: &str,
        rank: usize,
        mesh: &std::sync::Arc<MeshTopology>,
    ) -> Result<(Option<usize>, Layout)> {
        for (i, r) in self.rules.iter().enumerate() {
            if r.pattern.is_match(path) {
                if r.spec.len() != rank {
                    return Err(DTensorError::RuleRankMismatch {
                        pattern: r.pattern.to_string(),
                        path: path.to_string(),
                        layout_rank: r.spec.len(),
                        param_rank: rank,
                    });
                }
                return Ok((Some(i), Layout::from_topology(mesh, &r.spec)?));
            }
        }
        Ok((None, Layout::replicated_on(mesh, rank)))
    }

    /// Lays out every float parameter of `module` by the first matching rule (see the
    /// [module docs](self)): lazy parameters are created directly in their layout (the
    /// layout-mapped init: `map.apply(Model::new(&device), mesh.topology())`), materialised ones
    /// relaid out. `mesh` is the mesh the module lives on.
    ///
    /// # Errors
    /// Those of [`LayoutMap::layout_for`], [`DTensorError::ModuleOnOtherMesh`] for a module
    /// whose parameters live on another mesh than `mesh` (none is changed or materialised from
    /// that parameter on), and [`DTensorError::UnmatchedRule`] naming the rules that matched
    /// nothing together with the module's parameter paths.
    pub fn apply<B: DistributedOps, M: Module<B>>(
        &self,
        module: M,
        mesh: &std::sync::Arc<MeshTopology>,
    ) -> Result<(M, LayoutReport)> {
        let mut mapper = Mapper {
            map: self,
            mesh: mesh.clone(),
            path: Vec::new(),
            used: vec![false; self.rules.len()],
            report: LayoutReport::default(),
            error: None,
        };
        let module = module.map(&mut mapper);
        if let Some(e) = mapper.error {
            return Err(e);
        }
        let unmatched: Vec<String> = self
            .rules
            .iter()
            .zip(&mapper.used)
            .filter(|(_, u)| !**u)
            .map(|(r, _)| r.pattern.to_string())
            .collect();
        if !unmatched.is_empty() {
            return Err(DTensorError::UnmatchedRule {
                patterns: unmatched.join(", "),
                paths: mapper
                    .report
                    .assignments
                    .iter()
                    .map(|(p, _)| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok((module, mapper.report))
    }
}

/// Relayout of a parameter that keeps it a leaf of the autodiff graph (a tracked relayout
/// would make the parameter an intermediate node whose gradient the optimizer never sees).
fn relayout_leaf<B: DistributedOps, const D: usize>(
    t: Tensor<B, D>,
    layout: &Layout,
) -> Tensor<B, D> {
    if &crate::api::DTensorExt::layout(&t) == layout {
        return t;
    }
    let grad = t.is_require_grad();
    let prim = match t.into_primitive() {
        burn::tensor::TensorPrimitive::Float(p) => p,
        burn::tensor::TensorPrimitive::QFloat(q) => B::dequantize(q, burn::tensor::FloatDType::F32),
    };
    let out = B::float_relayout_leaf(prim, layout).unwrap_or_else(|e| panic!("burn-dtensor: {e}"));
    Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(out)).set_require_grad(grad)
}

struct Mapper<'a> {
    map: &'a LayoutMap,
    mesh: std::sync::Arc<MeshTopology>,
    path: Vec<String>,
    used: Vec<bool>,
    report: LayoutReport,
    error: Option<DTensorError>,
}

impl<B: DistributedOps> ModuleMapper<B> for Mapper<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let path = self.path.join(".");
        // The parameter's mesh (its device carries the mesh id), without materialising it.
        let device = param.lazy_device();
        if device.to_id().index_id != self.mesh.id {
            self.error = Some(DTensorError::ModuleOnOtherMesh {
                path,
                on: format!("{device:?}"),
                mesh: self.mesh.to_string(),
            });
            return param;
        }
        match self.map.layout_for(&path, D, &self.mesh) {
            Ok((rule, layout)) => {
                if let Some(i) = rule {
                    self.used[i] = true;
                }
                self.report.assignments.push((path, layout.clone()));
                // A parameter still lazy is materialised now, directly in its target layout:
                // its initializer's creation ops run under the layout as a scoped creation
                // layout, so each device (and process) draws only its shard. One already
                // materialised is relaid out.
                let shape = param.lazy_shape().to_vec();
                let lazy = !param.is_initialized();
                let to = |t| relayout_leaf(t, &layout);
                let param = if lazy {
                    crate::creation::with_creation_layout(&layout, &shape, || param.map(to))
                        .expect("the layout has the parameter's rank (checked by layout_for)")
                } else {
                    param.map(to)
                };
                param.load_mapper(move |t| relayout_leaf(t, &layout))
            }
            Err(e) => {
                self.error.get_or_insert(e);
                param
            }
        }
    }
}
