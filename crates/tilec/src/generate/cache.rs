//! The paged KV cache's bookkeeping: a pool of fixed-size blocks with a free list, and per
//! sequence the blocks it owns in order (its row of the block table). Block 0 is reserved as
//! the *null block*: unused table entries and the padding rows of a batch bucket point at it,
//! so whatever they write lands in scratch space no sequence reads.
//!
//! The tensors themselves (per layer `[blocks, block_size, kv_heads, head_dim]`) belong to the
//! step that runs `paged_attention`; this module only hands out block numbers.

use tilec_ir::Tensor;

/// The block every unused table entry names.
pub const NULL_BLOCK: u32 = 0;

/// Blocks of the pool and who owns them.
#[derive(Clone, Debug)]
pub struct BlockPool {
    block_size: usize,
    blocks: usize,
    /// Free blocks, the next one handed out last.
    free: Vec<u32>,
    /// Per sequence, its blocks in logical order.
    tables: Vec<Vec<u32>>,
}

impl BlockPool {
    /// A pool of `blocks` blocks (the null block included) of `block_size` tokens for
    /// `sequences` sequences.
    pub fn new(blocks: usize, block_size: usize, sequences: usize) -> Result<BlockPool, String> {
        if block_size == 0 || blocks < 2 || blocks > u32::MAX as usize {
            return Err(format!("a pool needs a positive block size and 2 to 2^32 blocks (the null block and one more), got {blocks} of {block_size}"));
        }
        let free = (1..blocks as u32).rev().collect();
        Ok(BlockPool { block_size, blocks, free, tables: vec![vec![]; sequences] })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Free blocks left.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// The blocks of sequence `seq`.
    pub fn table(&self, seq: usize) -> &[u32] {
        self.tables.get(seq).map(|t| t.as_slice()).unwrap_or(&[])
    }

    /// Gives sequence `seq` blocks until it can hold `tokens` tokens.
    pub fn reserve(&mut self, seq: usize, tokens: usize) -> Result<(), String> {
        let need = tokens.div_ceil(self.block_size);
        let bs = self.block_size;
        let Some(t) = self.tables.get_mut(seq) else {
            return Err(format!("sequence {seq} is not in the pool"));
        };
        while t.len() < need {
            let b = self.free.pop().ok_or_else(|| {
                format!("the KV cache is full: sequence {seq} needs {} blocks of {bs} tokens for {tokens} tokens", need)
            })?;
            t.push(b);
        }
        Ok(())
    }

    /// Returns sequence `seq`'s blocks to the free list.
    pub fn release(&mut self, seq: usize) {
        if let Some(t) = self.tables.get_mut(seq) {
            self.free.extend(t.drain(..).rev());
        }
    }

    /// The block table of a batch: `rows` rows of `max_blocks` entries, row `i` the blocks of
    /// sequence `seqs[i]`, every other entry (and every row past `seqs`) the null block.
    pub fn block_table(&self, seqs: &[usize], rows: usize, max_blocks: usize) -> Result<Tensor, String> {
        if seqs.len() > rows {
            return Err(format!("{} sequences do not fit a batch of {rows} rows", seqs.len()));
        }
        let mut v = vec![NULL_BLOCK as i32; rows * max_blocks];
        for (i, &s) in seqs.iter().enumerate() {
            let t = self.table(s);
            if t.len() > max_blocks {
                return Err(format!("sequence {s} holds {} blocks, the table has room for {max_blocks}", t.len()));
            }
            for (j, &b) in t.iter().enumerate() {
                v[i * max_blocks + j] = b as i32;
            }
        }
        Tensor::from_vec(vec![rows, max_blocks], v).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_handed_out_and_returned() {
        let mut p = BlockPool::new(5, 4, 2).unwrap();
        p.reserve(0, 5).unwrap();
        p.reserve(1, 1).unwrap();
        assert_eq!(p.table(0), &[1, 2]);
        assert_eq!(p.table(1), &[3]);
        assert_eq!(p.free(), 1);
        let e = p.reserve(1, 9).unwrap_err();
        assert!(e.contains("KV cache is full"), "{e}");
        let t = p.block_table(&[0, 1], 3, 3).unwrap();
        assert_eq!(t.to_i64_vec(), vec![1, 2, 0, 3, 4, 0, 0, 0, 0]);
        let t = p.block_table(&[1], 2, 3).unwrap();
        assert_eq!(t.to_i64_vec(), vec![3, 4, 0, 0, 0, 0]);
        assert!(p.block_table(&[0, 1], 1, 3).is_err());
        p.release(0);
        assert_eq!(p.free(), 2);
        assert!(p.table(0).is_empty());
        assert!(BlockPool::new(1, 4, 1).is_err());
    }
}
