//! The rows of a product, split over rayon's pool natively; one thread in wasm.

/// The fewest rows a task takes: enough work to hide the pool's hand-off.
#[cfg(not(target_arch = "wasm32"))]
const ROWS_PER_TASK: usize = 64;

/// Calls `f(first_row, out)` for consecutive runs of rows, `out` holding `per_row` values for
/// each row of the run; every run but the last is a multiple of `align` rows (a matrix's
/// interleaved groups).
pub fn for_row_chunks(out: &mut [f32], per_row: usize, align: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if per_row == 0 {
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(task) = task_rows(out.len() / per_row, align) {
        use rayon::prelude::*;
        out.par_chunks_mut(task * per_row).enumerate().for_each(|(i, run)| f(i * task, run));
        return;
    }
    // One thread: the whole run at once, without the pool's splitting (so no runs to align).
    let _ = align;
    f(0, out);
}

/// Rows a task of a product of `rows` rows takes over the pool (a multiple of `align`), or
/// None where it runs as one task: one thread, or too few rows to split.
#[cfg(not(target_arch = "wasm32"))]
fn task_rows(rows: usize, align: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    // About four tasks a thread, so that a thread slowed by another process does not hold up
    // the product, and no fewer rows a task than ROWS_PER_TASK.
    (threads > 1 && rows > ROWS_PER_TASK).then(|| rows.div_ceil(4 * threads).max(ROWS_PER_TASK).next_multiple_of(align.max(1)))
}

/// Rows a product's task computes at a time before writing them token-major
/// (`for_row_chunks_token_major`): 64 rows of a 128-token prompt are 32 KiB of sums, within a
/// core's cache.
const TRANSPOSE_ROWS: usize = 64;

thread_local! {
    /// Each thread's buffer of a piece's sums (`for_row_chunks_token_major`), kept between
    /// products: a fresh one a product cost a page fault a 4 KiB of it.
    static PIECE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `y` (`n` rows of `rows` values: a product's output token-major, as the next layer takes it)
/// from `f(first_row, out)`, which writes the sums of a run of rows one row after another (`n`
/// values a row), as `for_row_chunks` calls it: each task runs `f` on pieces of
/// `TRANSPOSE_ROWS` rows (whole `align`s) into its thread's buffer and writes each piece into
/// its columns of `y` while the piece is in the cache. One pass over the whole product
/// afterwards read every sum back from memory, a tenth of a prompt's time, and its row-major
/// buffer cost a page fault a 4 KiB each product.
///
/// Panics if `y` is not `rows · n` values (a shape bug of the caller).
pub(crate) fn for_row_chunks_token_major(y: &mut [f32], rows: usize, n: usize, align: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    assert_eq!(y.len(), rows * n, "a token-major product of {rows} rows and {n} tokens");
    if n <= 1 {
        // One token: the layouts agree.
        return for_row_chunks(y, n, align, f);
    }
    let columns = Columns(y.as_mut_ptr());
    let piece = TRANSPOSE_ROWS.next_multiple_of(align.max(1));
    let run = |first: usize, count: usize| {
        // Taken out of the thread's cell, so that a task that `f` let the thread steal finds an
        // empty one rather than this one's.
        let mut sums = PIECE.take();
        for start in (first..first + count).step_by(piece) {
            let len = piece.min(first + count - start);
            sums.clear();
            sums.resize(len * n, 0.0);
            f(start, &mut sums);
            for t in 0..n {
                // SAFETY: row t's columns start..start + len lie within y (rows · n values), and
                // only this task writes them: the tasks' runs of rows are disjoint.
                let to = unsafe { std::slice::from_raw_parts_mut(columns.at(t * rows + start), len) };
                for (r, v) in to.iter_mut().enumerate() {
                    *v = sums[r * n + t];
                }
            }
        }
        PIECE.set(sums);
    };
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(task) = task_rows(rows, align) {
        use rayon::prelude::*;
        (0..rows.div_ceil(task)).into_par_iter().for_each(|i| run(i * task, task.min(rows - i * task)));
        return;
    }
    run(0, rows);
}

/// A product's output shared by its tasks, each of which writes only its own columns.
#[derive(Clone, Copy)]
struct Columns(*mut f32);

// SAFETY: the tasks write disjoint values through it (`for_row_chunks_token_major`), while the
// buffer's one `&mut` is held by the function that waits for all of them.
unsafe impl Send for Columns {}
unsafe impl Sync for Columns {}

impl Columns {
    /// The pointer to value `i` (a method, so that closures capture the whole `Columns`).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// Calls `f(i, chunk)` for each `len`-value chunk of `out`, one task each.
pub(crate) fn for_each_chunk(out: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if len == 0 {
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(len).enumerate().for_each(|(i, chunk)| f(i, chunk));
    }
    #[cfg(target_arch = "wasm32")]
    for (i, chunk) in out.chunks_mut(len).enumerate() {
        f(i, chunk);
    }
}

/// The CPU backend's pool (`RAYON_NUM_THREADS` threads, default one per core). A step runs on
/// it as a whole (`on_pool`): its products then split rows among threads that are already awake,
/// where a product started from outside would hand its work over and sleep until it is done,
/// two context switches per product. None where the threads could not be started.
#[cfg(not(target_arch = "wasm32"))]
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().thread_name(|i| format!("kestrel-cpu-{i}")).build().ok()).as_ref()
}

/// Runs `f` on the CPU backend's thread pool (on the caller's thread in wasm, or where the pool
/// could not start).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(pool) = pool() {
        return pool.install(f);
    }
    f()
}

/// Calls `f` on each task, over the CPU backend's pool natively (one task a thread at a time,
/// in any order), one after another in wasm; the first error is returned.
pub(crate) fn try_each_on_pool<T: Send, E: Send>(tasks: Vec<T>, f: impl Fn(T) -> Result<(), E> + Sync + Send) -> Result<(), E> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        on_pool(|| tasks.into_par_iter().try_for_each(f))
    }
    #[cfg(target_arch = "wasm32")]
    tasks.into_iter().try_for_each(f)
}

pub(crate) fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    return pool().map_or(1, rayon::ThreadPool::current_num_threads);
    #[cfg(target_arch = "wasm32")]
    return 1;
}

/// The pool's copy bandwidth in GB/s (bytes read plus bytes written, a second), over two buffers
/// of `bytes` copied by all its threads, the best of 5 after a warm-up: the bench's roofline of a
/// decode step, which streams every weight once, as the GPU's copy kernel is the GPU's.
#[cfg(not(target_arch = "wasm32"))]
pub fn copy_bandwidth(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let source = vec![1u8; bytes];
    let mut target = vec![0u8; bytes];
    let chunk = bytes.div_ceil(4 * threads()).max(1);
    let mut copy = || {
        let start = std::time::Instant::now();
        on_pool(|| target.par_chunks_mut(chunk).zip(source.par_chunks(chunk)).for_each(|(t, s)| t.copy_from_slice(s)));
        start.elapsed().as_secs_f64()
    };
    copy();
    let best = (0..5).map(|_| copy()).fold(f64::INFINITY, f64::min);
    2.0 * bytes as f64 / best.max(1e-9) / 1e9
}
