package fsdiff

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// MaxContentBytes bounds the file content one diff reads (both sides counted): beyond it the diff stops and says
// it is truncated. Two 64 GiB files of data took minutes of CPU and disk to compare; holes cost nothing.
const MaxContentBytes = 4 << 30

// maxContentBytes is MaxContentBytes; tests lower it.
var maxContentBytes int64 = MaxContentBytes

// errContentBudget ends a comparison that would read more than maxContentBytes of content.
var errContentBudget = errors.New("the diff's content budget is spent")

const (
	chunk = 128 << 10 // bytes read from each file at once
	// checkEvery is how much content is read between two looks at the comparison's context.
	checkEvery = 4 << 20
)

// bufPool holds pairs of read buffers for sameContent.
var bufPool = sync.Pool{New: func() any { return new([2][chunk]byte) }}

// zeros is a chunk of what a hole reads as.
var zeros [chunk]byte

// sameContent compares the regular files a and b of the same size, stopping at the first difference. It reads
// only their data: SEEK_DATA/SEEK_HOLE split the file into runs where each file is data throughout or a hole
// throughout; a run that is a hole in both is equal unread, a run that is data in one only is equal if that data
// is all zeros. What it reads counts against c.left (errContentBudget when spent), and it stops when c.ctx ends.
func sameContent(c *comparison, a, b *entry) (bool, error) {
	var fds [2]int
	for i, e := range []*entry{a, b} {
		fd, err := e.t.openRegular(e.rel)
		if err != nil {
			if i == 1 {
				unix.Close(fds[0])
			}
			return false, err
		}
		fds[i] = fd
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	names := [2]string{a.t.at(a.rel), b.t.at(b.rel)}
	bufs := bufPool.Get().(*[2][chunk]byte)
	defer bufPool.Put(bufs)
	size := a.st.Size
	var sinceCheck int64
	for pos := int64(0); pos < size; {
		if err := c.ctx.Err(); err != nil {
			return false, err
		}
		start, end, isData, err := nextRun(fds, pos, size)
		if err != nil {
			return false, fmt.Errorf("seek %s or %s: %w", names[0], names[1], err)
		}
		for pos = start; pos < end; pos += chunk {
			n := min(end-pos, chunk)
			var cost int64
			for i := range fds {
				if isData[i] {
					cost += n
				}
			}
			if c.left < cost {
				return false, errContentBudget
			}
			c.left -= cost
			var got [2][]byte
			for i, fd := range fds {
				if got[i] = zeros[:n]; isData[i] {
					got[i] = bufs[i][:n]
					if err := preadFull(fd, got[i], pos); err != nil {
						return false, fmt.Errorf("read %s: %w", names[i], err)
					}
				}
			}
			if !bytes.Equal(got[0], got[1]) {
				return false, nil
			}
			if sinceCheck += cost; sinceCheck >= checkEvery {
				sinceCheck = 0
				if err := c.ctx.Err(); err != nil {
					return false, err
				}
			}
		}
		pos = end
	}
	return true, nil
}

// nextRun is the next run at or after pos of the two files open as fds (size bytes each) that is data in either:
// [start, end), where each file is data throughout or a hole throughout (isData). Before start both are holes;
// start == end == size when no data is left. A file of at most one chunk is one run of data: seeking its holes
// would cost more system calls than reading them.
func nextRun(fds [2]int, pos, size int64) (start, end int64, isData [2]bool, err error) {
	if size <= chunk {
		return pos, size, [2]bool{true, true}, nil
	}
	var data [2]int64
	for i, fd := range fds {
		if data[i], err = seek(fd, pos, unix.SEEK_DATA, size); err != nil {
			return 0, 0, isData, err
		}
	}
	start, end = min(data[0], data[1]), size
	if start == size {
		return size, size, isData, nil
	}
	for i, fd := range fds {
		if data[i] > start {
			end = min(end, data[i]) // a hole up to there
			continue
		}
		isData[i] = true
		hole, err := seek(fd, start, unix.SEEK_HOLE, size)
		if err != nil {
			return 0, 0, isData, err
		}
		end = min(end, hole)
	}
	return start, end, isData, nil
}

// seek is lseek(fd, pos, whence) for SEEK_DATA or SEEK_HOLE, at most size: no data after pos (ENXIO) is size.
func seek(fd int, pos int64, whence int, size int64) (int64, error) {
	off, err := unix.Seek(fd, pos, whence)
	if err == unix.ENXIO {
		return size, nil
	}
	if err != nil {
		return 0, err
	}
	return min(off, size), nil
}

// preadFull fills b from fd at off; a file that ends early (changed under us) is io.ErrUnexpectedEOF.
func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
