//! Shapes with fixed and symbolic dimensions.
//!
//! A symbolic dimension names a [`SymbolId`] in the graph's [`SymbolTable`]. A symbol is
//! either free (bound at run time from an input's actual shape, e.g. a dynamic batch) or
//! derived from other dimensions by a small expression (e.g. `batch * 12`), so that shape
//! arithmetic done by exported models stays exact without knowing the value.

use std::collections::HashMap;
use std::fmt;

/// Index of a symbol in a graph's [`SymbolTable`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SymbolId(pub u32);

/// One dimension of a tensor type.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Fixed(usize),
    Sym(SymbolId),
}

impl Dim {
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

/// How a derived symbol is computed from other dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SymExpr {
    Add(Dim, Dim),
    Sub(Dim, Dim),
    Mul(Dim, Dim),
    /// Floor division.
    Div(Dim, Dim),
    /// Ceiling division.
    CeilDiv(Dim, Dim),
    Max(Dim, Dim),
    Min(Dim, Dim),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Symbol {
    pub name: String,
    /// `None` for a free symbol (bound from an input shape at run time).
    pub expr: Option<SymExpr>,
}

/// The symbols of one graph. Derived symbols are interned: asking twice for `a * b`
/// returns the same id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SymbolTable {
    pub symbols: Vec<Symbol>,
    interned: HashMap<SymExpr, SymbolId>,
}

impl SymbolTable {
    /// A free symbol with this name; the same name gives the same symbol.
    pub fn free(&mut self, name: &str) -> SymbolId {
        if let Some(i) = self
            .symbols
            .iter()
            .position(|s| s.expr.is_none() && s.name == name)
        {
            return SymbolId(i as u32);
        }
        self.symbols.push(Symbol { name: name.to_string(), expr: None });
        SymbolId(self.symbols.len() as u32 - 1)
    }

    /// A fresh free symbol named after `hint`, distinct from every other symbol.
    pub fn fresh(&mut self, hint: &str) -> SymbolId {
        let name = format!("{hint}_{}", self.symbols.len());
        self.symbols.push(Symbol { name, expr: None });
        SymbolId(self.symbols.len() as u32 - 1)
    }

    pub fn name(&self, id: SymbolId) -> &str {
        self.symbols.get(id.0 as usize).map(|s| s.name.as_str()).unwrap_or("?")
    }

    /// A dimension for `expr`, folded to a fixed size when both operands are fixed.
    pub fn derive(&mut self, expr: SymExpr) -> Dim {
        use SymExpr::*;
        let fold = |a: Dim, b: Dim, f: &dyn Fn(usize, usize) -> Option<usize>| match (a, b) {
            (Dim::Fixed(x), Dim::Fixed(y)) => f(x, y),
            _ => None,
        };
        let folded = match &expr {
            Add(a, b) => fold(*a, *b, &|x, y| x.checked_add(y)),
            Sub(a, b) => fold(*a, *b, &|x, y| x.checked_sub(y)),
            Mul(a, b) => fold(*a, *b, &|x, y| x.checked_mul(y)),
            Div(a, b) => fold(*a, *b, &|x, y| x.checked_div(y)),
            CeilDiv(a, b) => fold(*a, *b, &|x, y| if y == 0 { None } else { Some(x.div_ceil(y)) }),
            Max(a, b) => fold(*a, *b, &|x, y| Some(x.max(y))),
            Min(a, b) => fold(*a, *b, &|x, y| Some(x.min(y))),
        };
        if let Some(n) = folded {
            return Dim::Fixed(n);
        }
        // Identities that keep the symbol itself.
        match &expr {
            Mul(a, Dim::Fixed(1)) | Mul(Dim::Fixed(1), a) | Div(a, Dim::Fixed(1)) => return *a,
            Add(a, Dim::Fixed(0)) | Add(Dim::Fixed(0), a) | Sub(a, Dim::Fixed(0)) => return *a,
            Max(a, b) | Min(a, b) if a == b => return *a,
            _ => {}
        }
        if let Some(id) = self.interned.get(&expr) {
            return Dim::Sym(*id);
        }
        let name = format!("s{}", self.symbols.len());
        self.symbols.push(Symbol { name, expr: Some(expr.clone()) });
        let id = SymbolId(self.symbols.len() as u32 - 1);
        self.interned.insert(expr, id);
        Dim::Sym(id)
    }

    /// Evaluates a dimension given values for the free symbols. Returns `None` when a
    /// free symbol it depends on is unbound or the arithmetic is undefined.
    pub fn eval(&self, d: Dim, bound: &HashMap<SymbolId, usize>) -> Option<usize> {
        match d {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(id) => {
                if let Some(v) = bound.get(&id) {
                    return Some(*v);
                }
                let sym = self.symbols.get(id.0 as usize)?;
                let e = sym.expr.as_ref()?;
                let ev = |x: &Dim| self.eval(*x, bound);
                use SymExpr::*;
                match e {
                    Add(a, b) => ev(a)?.checked_add(ev(b)?),
                    Sub(a, b) => ev(a)?.checked_sub(ev(b)?),
                    Mul(a, b) => ev(a)?.checked_mul(ev(b)?),
                    Div(a, b) => ev(a)?.checked_div(ev(b)?),
                    CeilDiv(a, b) => {
                        let d = ev(b)?;
                        if d == 0 {
                            None
                        } else {
                            Some(ev(a)?.div_ceil(d))
                        }
                    }
                    Max(a, b) => Some(ev(a)?.max(ev(b)?)),
                    Min(a, b) => Some(ev(a)?.min(ev(b)?)),
                }
            }
        }
    }

    /// Whether `d` is a derived dimension that can never have a value: arithmetic on fixed
    /// sizes that overflowed or is undefined (derive folds every fixed operation that
    /// succeeds), or an expression over such a dimension.
    pub fn undefined(&self, d: Dim) -> bool {
        let Dim::Sym(id) = d else { return false };
        let Some(Symbol { expr: Some(e), .. }) = self.symbols.get(id.0 as usize) else { return false };
        use SymExpr::*;
        let (Add(a, b) | Sub(a, b) | Mul(a, b) | Div(a, b) | CeilDiv(a, b) | Max(a, b) | Min(a, b)) = e;
        matches!((a, b), (Dim::Fixed(_), Dim::Fixed(_))) || self.undefined(*a) || self.undefined(*b)
    }

    /// Human-readable form of a shape (`[batch, 7]`).
    pub fn display_shape(&self, shape: &[Dim]) -> String {
        let dims: Vec<String> = shape.iter().map(|&d| self.display(d)).collect();
        format!("[{}]", dims.join(", "))
    }

    /// Human-readable form of a dimension (`7`, `batch`, `(batch*12)`).
    pub fn display(&self, d: Dim) -> String {
        match d {
            Dim::Fixed(n) => n.to_string(),
            Dim::Sym(id) => match self.symbols.get(id.0 as usize) {
                None => format!("?{}", id.0),
                Some(Symbol { name, expr: None }) => name.clone(),
                Some(Symbol { expr: Some(e), .. }) => {
                    use SymExpr::*;
                    let (a, op, b) = match e {
                        Add(a, b) => (a, "+", b),
                        Sub(a, b) => (a, "-", b),
                        Mul(a, b) => (a, "*", b),
                        Div(a, b) => (a, "/", b),
                        CeilDiv(a, b) => (a, "/^", b),
                        Max(a, b) => (a, " max ", b),
                        Min(a, b) => (a, " min ", b),
                    };
                    format!("({}{}{})", self.display(*a), op, self.display(*b))
                }
            },
        }
    }
}

/// The static type of a tensor value: element type and (possibly symbolic) shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: crate::DType,
    pub shape: Vec<Dim>,
}

impl TensorType {
    pub fn new(dtype: crate::DType, shape: Vec<Dim>) -> Self {
        TensorType { dtype, shape }
    }

    pub fn fixed(dtype: crate::DType, shape: &[usize]) -> Self {
        TensorType { dtype, shape: shape.iter().map(|&n| Dim::Fixed(n)).collect() }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape when every dimension is fixed.
    pub fn fixed_shape(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(|d| d.fixed()).collect()
    }

    /// Element count when the shape is fixed and addressable (see [`crate::size`]).
    pub fn numel(&self) -> Option<usize> {
        crate::size::numel(&self.fixed_shape()?).ok()
    }

    /// Bytes of the value when the shape is fixed and addressable.
    pub fn byte_size(&self) -> Option<usize> {
        crate::size::byte_size(self.dtype, &self.fixed_shape()?).ok()
    }
}

/// Formats a list of fixed sizes as `[2, 3]`.
pub struct ShapeFmt<'a>(pub &'a [usize]);

impl fmt::Display for ShapeFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}
