"""Typed video errors. Each message is one line, names the file, and says what to do."""
from medclaw.errors import MedClawError


class VideoError(MedClawError):
    """Base class for problems with a video file."""


class NotAFileError(VideoError):
    """The path does not exist or is not a regular file."""


class UnreadableVideoError(VideoError):
    """The file exists but cannot be read (permissions, I/O error)."""


class NotAVideoError(VideoError):
    """The file is not a media container, or has no video stream."""


class CorruptVideoError(VideoError):
    """The data is corrupt or truncated; the message says where decoding failed."""


class ZeroDurationError(VideoError):
    """The video stream has no frames or no duration."""


class TimeRangeError(VideoError):
    """Requested times fall outside [0, duration] or start >= end."""


class FrameTooLargeError(VideoError):
    """Frames exceed the configured pixel cap."""


class DecodeResourceError(MedClawError):
    """Decoding failed for lack of memory (host or GPU) or a CUDA/NVDEC failure — not the video."""


class FrameIdentityError(CorruptVideoError):
    """No decoder returned the planned frame (its pts never came out of the stream)."""


class DecodeTimeoutError(VideoError):
    """Decoding took longer than the configured timeout."""


class EncoderError(VideoError):
    """ffmpeg is missing, or failed while writing a video."""


class InvalidCropError(VideoError):
    """A crop box is malformed or outside the frame (normalised 0 <= x1 < x2 <= 1, same for y)."""
